"""The worker runtime: claims runs under a lease, executes them, records the outcome, repeats.

    loop       claim, execute, record: one loop body for 1..N task threads; idle waits
    held       the runs in hand and what is known of them, behind one lock
    execute    one task call, capturing what it returns or raises
    recorder   outcomes through the fenced services; buffered successes; never stops the worker
    heartbeat  the thread that keeps the worker row fresh and the leases alive
    signals    SIGTERM/SIGINT: finish the runs in hand, then stop

The worker only calls services: every rule (what a claim takes, what an
outcome writes, when a run retries) lives there.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Sequence
from typing import Any

from ..clock import Clock, SystemClock, current_clock
from ..conf import RANGES, conf
from ..models import Run
from ..registry import TaskRegistry
from ..registry import registry as default_registry
from ..services import workers
from ..services.capabilities import excluded_tasks, validate_capabilities
from ..services.validation import bounded_float, bounded_int, validate_queue, validate_worker_id
from ..text import storable
from .execute import Execution, describe_exception, format_traceback
from .guard import Guard
from .heartbeat import Heartbeat
from .held import Held
from .loop import Loop, Pace
from .pacing import idle_ceiling
from .recorder import Recorder
from .wakeup import Wakeup

__all__ = ["Execution", "Worker", "default_worker_id", "describe_exception", "format_traceback"]

logger = logging.getLogger("distsched")

MAX_CONCURRENCY = 256


def default_worker_id() -> str:
    # A hostname may hold anything and be up to 253 characters: keep the id storable and short.
    host = storable(socket.gethostname()).replace(" ", "_")[:150] or "host"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


ALL_QUEUES = "*"


def _queues(queues: Sequence[str] | None) -> list[str]:
    """The queues a worker serves: ``["default"]`` unless given; ``[]`` (every queue) for ``"*"``."""
    if not queues:
        return ["default"]
    if ALL_QUEUES in queues:
        return []
    return [validate_queue(q, field="queues") for q in queues]


def _option(value: float | None, setting: str, field: str) -> float:
    """A worker option, or its setting's value, within the setting's range (``conf.RANGES``)."""
    kind, low, high = RANGES[setting]
    chosen = getattr(conf, setting) if value is None else value
    if kind is int:
        return bounded_int(chosen, field=field, low=int(low), high=int(high))
    return bounded_float(chosen, field=field, low=low, high=high)


class Worker:
    """Executes runs from the given queues: ``run_once()``, or ``run()`` until stopped."""

    def __init__(
        self,
        *,
        worker_id: str | None = None,
        queues: Sequence[str] | None = None,
        capabilities: Sequence[str] | None = None,
        lease_seconds: float | None = None,
        poll_interval: float | None = None,
        heartbeat_seconds: float | None = None,
        heartbeat_jitter: float | None = None,
        idle_poll_max: float | None = None,
        with_tick: bool = False,
        prefetch: int | None = None,
        concurrency: int = 1,
        clock: Clock | None = None,
        registry: TaskRegistry | None = None,
    ) -> None:
        # Checked here, with typed errors: a bad option must fail the start, not the loop.
        self.worker_id = validate_worker_id(worker_id) if worker_id else default_worker_id()
        # "*" serves every queue: no queue filter at all in the claim (stored as [] on the worker row).
        self.queues = _queues(queues)
        # What it offers: runs of a task in TASK_REQUIRES are claimed only with all its capabilities.
        self.capabilities = validate_capabilities(capabilities or ())
        excluded_tasks(self.capabilities)  # a malformed TASK_REQUIRES fails the start, not every claim
        self.lease_seconds = _option(lease_seconds, "LEASE_SECONDS", "lease_seconds")
        self.poll_interval = _option(poll_interval, "POLL_INTERVAL", "poll_interval")
        self.heartbeat_seconds = _option(heartbeat_seconds, "HEARTBEAT_SECONDS", "heartbeat_seconds")
        self.heartbeat_jitter = _option(heartbeat_jitter, "HEARTBEAT_JITTER", "heartbeat_jitter")
        # The longest idle poll while notifications wake this worker (``pacing.IdleBackoff``).
        self.idle_poll_max = idle_ceiling(
            poll=self.poll_interval,
            lease_seconds=self.lease_seconds,
            maximum=_option(idle_poll_max, "IDLE_POLL_MAX_SECONDS", "idle_poll_max"),
        )
        self.with_tick = with_tick
        self.prefetch = int(_option(prefetch, "PREFETCH", "prefetch"))
        self.concurrency = bounded_int(concurrency, field="concurrency", low=1, high=MAX_CONCURRENCY)
        self.clock = clock or current_clock()
        self.registry = registry or default_registry
        self.registered = False
        self.hard_stopped = False  # a second signal: give up retries, exit now
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by a stop request, a wake-up notification, or wake()
        self.held = Held()
        self.recorder = Recorder(self)
        self.heartbeat_thread = Heartbeat(self)
        self.loop = Loop(self)
        self.wakeup = Wakeup(self)
        self.guard = Guard(self)

    # -- state ----------------------------------------------------------------------

    @property
    def executed(self) -> int:
        """Task calls completed by this worker since it was created."""
        return self.held.executed

    @property
    def pace(self) -> Pace:
        """How quick recent tasks were: quick ones (under 50 ms) are prefetched in batches."""
        return self.loop.pace

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def request_stop(self) -> None:
        """Finish the current run(s), claim nothing more. Safe from a signal handler."""
        self._stop.set()
        self._wake.set()

    def wake(self) -> None:
        """End the current idle wait now (a run became claimable). Safe from any thread."""
        self._wake.set()

    def take_wake(self) -> bool:
        """Whether a wake-up came since the last wait (and forget it)."""
        if self._wake.is_set() and not self._stop.is_set():
            self._wake.clear()
            return True
        return False

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``, waking at once on a stop request or a wake-up. True if woken."""
        woken = self._wake.wait(seconds)
        if not self._stop.is_set():
            self._wake.clear()
        return woken

    # -- lifecycle ------------------------------------------------------------------

    def register(self) -> None:
        workers.register_worker(
            worker_id=self.worker_id,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            queues=self.queues,
            capabilities=self.capabilities,
            now=self.clock.now(),
            tasks=self.registry.names(),
        )
        self.registered = True
        self.log(
            logging.INFO,
            "worker started",
            database=workers.database_label(),
            queues=",".join(self.queues) or ALL_QUEUES,
            capabilities=",".join(self.capabilities) or "-",
            not_taking=",".join(excluded_tasks(self.capabilities)) or None,
            lease=self.lease_seconds,
            prefetch=self.prefetch,
            concurrency=self.concurrency,
            tick="with-tick" if self.with_tick else "no",
            tasks=len(self.registry.names()),
            pid=os.getpid(),
        )
        skew = self.check_clock_skew()
        if skew is not None:
            workers.heartbeat(worker_id=self.worker_id, now=self.clock.now(), clock_skew_seconds=skew)

    def check_clock_skew(self) -> float | None:
        """Compare this machine's clock with the database's (PostgreSQL); warn past the limit."""
        if not isinstance(self.clock, SystemClock):
            return None  # an injected clock is the test's business
        skew = workers.measure_clock_skew()
        if skew is not None and abs(skew) > conf.MAX_CLOCK_SKEW_SECONDS:
            self.log(
                logging.WARNING,
                "clock skew with the database exceeds MAX_CLOCK_SKEW_SECONDS",
                skew_seconds=f"{skew:.3f}",
                limit=conf.MAX_CLOCK_SKEW_SECONDS,
            )
        return skew

    def heartbeat(self) -> None:
        """Refresh the worker row; renew the lease of every run held (fenced); show a
        prefetched run that has been executing for a while as running."""
        self.heartbeat_thread.beat()

    # -- running --------------------------------------------------------------------

    def run(self, *, max_runs: int | None = None, burst: bool = False, install_signals: bool = True) -> int:
        """Serve until stopped (signal or ``request_stop``), ``max_runs`` executions,
        or, with ``burst``, until nothing is due. Returns the number executed."""
        return self.loop.run(max_runs=max_runs, burst=burst, install_signals=install_signals)

    def run_once(self) -> Execution | None:
        """Claim and execute at most one due run; None when nothing is due."""
        return self.loop.run_once()

    def execute(self, run: Run) -> Execution:
        """Execute a run this worker has just claimed, and record its outcome."""
        return self.loop.execute(self.held.hold([run])[0], flush=True)

    def flush(self) -> set[int] | None:
        """Write buffered successes now (see ``Recorder.flush``)."""
        return self.recorder.flush()

    # -- logging --------------------------------------------------------------------

    def logs(self, level: int) -> bool:
        """Whether ``log`` at ``level`` writes anything (the worker's logger is enabled for it)."""
        return logger.isEnabledFor(level)

    def log(self, level: int, message: str, *args: Any, **fields: Any) -> None:
        """``args`` fill ``%s`` in ``message`` (one template per kind of line); ``fields`` are the
        key=value or JSON fields."""
        if logger.isEnabledFor(level):
            data: dict[str, Any] = {"worker_id": self.worker_id}
            # Task errors reach log lines too: escaped, so no handler's encoder can fail on them.
            data.update({k: storable(v) if isinstance(v, str) else v for k, v in fields.items() if v is not None})
            escaped = tuple(storable(a) if isinstance(a, str) else a for a in args)
            logger.log(level, message, *escaped, extra={"distsched": data})
