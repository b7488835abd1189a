"""The worker runtime: claim, execute outside any transaction, record, repeat.

A worker holds at most one run at a time. A heartbeat thread keeps the
worker row fresh and renews the current run's lease (fenced), so a long task
is never re-claimed while its worker is alive; if the process dies, the lease
deadline, not the heartbeat, decides when another worker may take the run.
Database errors (locked, connection lost) are logged and retried with
backoff: they never kill the worker.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, close_old_connections, connection

from .clock import Clock, SystemClock, system_clock
from .conf import conf
from .context import RunContext
from .errors import RunCancelled
from .models import Run, WorkerStatus
from .registry import TaskRegistry
from .registry import registry as default_registry
from .services import claiming, outcomes, workers
from .services import tick as tick_service

logger = logging.getLogger("distsched")

TRANSIENT_DB_ERRORS = (OperationalError, InterfaceError)
MAX_DB_BACKOFF_SECONDS = 30.0


@dataclass(frozen=True, kw_only=True)
class Execution:
    """What happened to one claimed run in this worker."""

    run_id: int
    attempt: int
    state: str | None  # the recorded state; None if the lease was lost or recording failed
    duration: float
    error: str = ""


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def describe_exception(exc: BaseException) -> str:
    """``Type: message`` even for exceptions whose ``str()`` raises."""
    name = type(exc).__name__
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not break the worker
        text = "<unprintable exception>"
    return f"{name}: {text}" if text else name


def format_traceback(exc: BaseException) -> str:
    try:
        return "".join(traceback.format_exception(exc))
    except Exception:  # noqa: BLE001
        return f"<traceback unavailable for {type(exc).__name__}>"


def jsonable_result(value: Any) -> Any:
    """Store what JSON can hold; otherwise a bounded repr, never a crash."""
    if value is None:
        return None
    try:
        encoded = json.dumps(value, allow_nan=False)
        if len(encoded) <= conf.MAX_PAYLOAD_BYTES:
            return value
        return {"truncated": encoded[:1000]}
    except (TypeError, ValueError, RecursionError):
        try:
            return {"repr": repr(value)[:1000]}
        except Exception:  # noqa: BLE001
            return {"repr": f"<unrepresentable {type(value).__name__}>"}


class Worker:
    """Executes runs from the given queues. ``run_once()`` or ``run()``."""

    def __init__(
        self,
        *,
        worker_id: str | None = None,
        queues: Sequence[str] | None = None,
        lease_seconds: float | None = None,
        poll_interval: float | None = None,
        heartbeat_seconds: float | None = None,
        with_tick: bool = False,
        clock: Clock | None = None,
        registry: TaskRegistry | None = None,
    ) -> None:
        self.worker_id = worker_id or default_worker_id()
        self.queues = list(queues) if queues else ["default"]
        self.lease_seconds = float(lease_seconds if lease_seconds is not None else conf.LEASE_SECONDS)
        self.poll_interval = float(poll_interval if poll_interval is not None else conf.POLL_INTERVAL)
        self.heartbeat_seconds = float(
            heartbeat_seconds if heartbeat_seconds is not None else conf.HEARTBEAT_SECONDS
        )
        self.with_tick = with_tick
        self.clock = clock or system_clock
        self.registry = registry or default_registry
        self.executed = 0
        self._registered = False
        self._stop = threading.Event()
        self._hard_stop = False
        self._lock = threading.Lock()
        self._current: tuple[int, int] | None = None
        self._cancel_seen = False
        self._lease_lost = False
        self._heartbeat_thread: threading.Thread | None = None
        self._heartbeat_stop = threading.Event()
        self._next_tick = 0.0

    # -- lifecycle ---------------------------------------------------------------

    def register(self) -> None:
        workers.register_worker(
            worker_id=self.worker_id, hostname=socket.gethostname(), pid=os.getpid(),
            queues=self.queues, now=self.clock.now(),
        )
        self._registered = True
        self._log(logging.INFO, "worker started", queues=",".join(self.queues), lease=self.lease_seconds)
        skew = self.check_clock_skew()
        if skew is not None:
            workers.heartbeat(worker_id=self.worker_id, now=self.clock.now(), clock_skew_seconds=skew)

    def check_clock_skew(self) -> float | None:
        """Compare this machine's clock with the database's (PostgreSQL); warn past the limit."""
        if not isinstance(self.clock, SystemClock):
            return None  # an injected clock is the test's business
        skew = workers.measure_clock_skew()
        if skew is not None and abs(skew) > conf.MAX_CLOCK_SKEW_SECONDS:
            self._log(logging.WARNING, "clock skew with the database exceeds MAX_CLOCK_SKEW_SECONDS",
                      skew_seconds=f"{skew:.3f}", limit=conf.MAX_CLOCK_SKEW_SECONDS)
        return skew

    def request_stop(self) -> None:
        """Finish the current run, claim nothing more. Safe from a signal handler."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def heartbeat(self) -> None:
        """Refresh the worker row and renew the current run's lease (fenced)."""
        now = self.clock.now()
        with self._lock:
            current = self._current
        status = WorkerStatus.STOPPING if self._stop.is_set() else None
        alive = workers.heartbeat(
            worker_id=self.worker_id, now=now, status=status,
            current_run_id=current[0] if current else None, runs_executed=self.executed,
            clock_skew_seconds=self.check_clock_skew(),
        )
        if not alive:
            self.register()
        if current is None:
            return
        lease = outcomes.renew_lease(
            run_id=current[0], worker_id=self.worker_id, attempt=current[1], now=now,
            lease_seconds=self.lease_seconds,
        )
        with self._lock:
            if self._current != current:
                return
            if not lease.held and not self._lease_lost:
                self._lease_lost = True
                self._log(logging.WARNING, "lease lost while running", run_id=current[0], attempt=current[1])
            if lease.cancel_requested:
                self._cancel_seen = True

    # -- one run -----------------------------------------------------------------

    def run_once(self) -> Execution | None:
        """Claim and execute at most one due run; None when nothing is due."""
        if not self._registered:
            self.register()
        with self._heartbeat_running():
            self._maybe_tick(force=True)
            run = self._claim()
            if run is None:
                return None
            return self.execute(run)

    def _claim(self) -> Run | None:
        return claiming.claim_next_run(
            worker_id=self.worker_id, queues=self.queues, lease_seconds=self.lease_seconds,
            now=self.clock.now(),
        )

    def _maybe_tick(self, force: bool = False) -> None:
        if not self.with_tick:
            return
        if not force and time.monotonic() < self._next_tick:
            return
        self._next_tick = time.monotonic() + self.poll_interval
        tick_service.tick(now=self.clock.now())

    def execute(self, run: Run) -> Execution:
        """Run the task of a run we hold, outside any transaction, then record it."""
        attempt = run.attempts
        with self._lock:
            self._current = (run.pk, attempt)
            self._cancel_seen = bool(run.cancel_requested)
            self._lease_lost = False
        context = RunContext(
            run_id=run.pk, schedule_id=run.schedule_id, schedule_name=run.schedule.name,
            worker_id=self.worker_id, scheduled_for=run.scheduled_for, attempt=attempt,
            idempotency_key=run.idempotency_key, _cancel_probe=self._cancel_probe(run.pk),
        )
        fields = {"run_id": run.pk, "schedule": run.schedule.name, "task": run.task_name, "attempt": attempt}
        self._log(logging.DEBUG, "run started", **fields)
        started = time.monotonic()
        error = ""
        tb = ""
        cancelled = False
        result: Any = None
        try:
            entry = self.registry.get(run.task_name)
            kwargs = dict(run.kwargs)
            if entry.accepts_context:
                kwargs["context"] = context
            result = entry.func(*run.args, **kwargs)
            failed = False
        except RunCancelled as exc:
            failed, cancelled, error = True, True, describe_exception(exc)
        except BaseException as exc:  # noqa: BLE001 - SystemExit/KeyboardInterrupt from task code are failures too
            failed, error, tb = True, describe_exception(exc), format_traceback(exc)
        duration = time.monotonic() - started
        with self._lock:
            cancel_seen = self._cancel_seen
        if failed:
            state = self._record(
                outcomes.record_failure, run_id=run.pk, worker_id=self.worker_id, attempt=attempt,
                error=error, traceback_text=tb, cancelled=cancelled,
            )
        else:
            note = "returned normally after a cancel request" if cancel_seen else ""
            ok = self._record(
                outcomes.record_success, run_id=run.pk, worker_id=self.worker_id, attempt=attempt,
                result=jsonable_result(result), note=note,
            )
            state = "succeeded" if ok else None
        with self._lock:
            self._current = None
        self.executed += 1
        level = logging.INFO if state in ("succeeded", "cancelled") else logging.WARNING
        self._log(level, "run finished", **fields, state=state or "lease_lost", duration=f"{duration:.3f}",
                  error=error[:200] if error else None)
        return Execution(run_id=run.pk, attempt=attempt, state=state, duration=duration, error=error)

    def _cancel_probe(self, run_id: int) -> Callable[[], bool]:
        last_check = [0.0]

        def probe() -> bool:
            with self._lock:
                if self._cancel_seen:
                    return True
            # Ask the database at most once a second; the heartbeat also refreshes it.
            if time.monotonic() - last_check[0] >= 1.0:
                last_check[0] = time.monotonic()
                try:
                    flag = Run.objects.filter(pk=run_id).values_list("cancel_requested", flat=True).first()
                except DatabaseError:
                    flag = False
                if flag:
                    with self._lock:
                        self._cancel_seen = True
                    return True
            return False

        return probe

    def _record(self, fn: Callable[..., Any], **kwargs: Any) -> Any:
        """Record an outcome, retrying transient database errors with backoff.

        Gives up after about two lease periods: by then the run has been (or
        will be) recovered by lease expiry, which is the at-least-once path.
        """
        delay = 0.2
        deadline = time.monotonic() + max(2 * self.lease_seconds, 10.0)
        while True:
            try:
                return fn(now=self.clock.now(), **kwargs)
            except TRANSIENT_DB_ERRORS as exc:
                self._reset_connection()
                if self._hard_stop or time.monotonic() > deadline:
                    self._log(logging.ERROR, "giving up recording outcome; lease expiry will recover the run",
                              run_id=kwargs.get("run_id"), error=describe_exception(exc))
                    return None
                self._log(logging.WARNING, "database error while recording; retrying",
                          run_id=kwargs.get("run_id"), error=describe_exception(exc), retry_in=f"{delay:.1f}")
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
            except DatabaseError as exc:
                self._log(logging.ERROR, "could not record outcome", run_id=kwargs.get("run_id"),
                          error=describe_exception(exc))
                return None

    # -- the loop ----------------------------------------------------------------

    def run(self, *, max_runs: int | None = None, burst: bool = False, install_signals: bool = True) -> int:
        """Serve until stopped (signal or ``request_stop``), ``max_runs`` executions,
        or, with ``burst``, until nothing is due. Returns the number executed."""
        restore = self._install_signals() if install_signals else None
        executed_before = self.executed
        backoff = 0.5
        try:
            self._retry_db(self.register)
            with self._heartbeat_running():
                while not self._stop.is_set():
                    if max_runs is not None and self.executed - executed_before >= max_runs:
                        break
                    try:
                        self._maybe_tick()
                        run = self._claim()
                        backoff = 0.5
                    except TRANSIENT_DB_ERRORS as exc:
                        self._log(logging.WARNING, "database error in worker loop; backing off",
                                  error=describe_exception(exc), retry_in=f"{backoff:.1f}")
                        self._reset_connection()
                        self._stop.wait(backoff)
                        backoff = min(backoff * 2, MAX_DB_BACKOFF_SECONDS)
                        continue
                    if run is None:
                        if burst:
                            break
                        self._stop.wait(self.poll_interval)
                        continue
                    self.execute(run)
        finally:
            self._retry_db(lambda: workers.set_status(
                worker_id=self.worker_id, status=WorkerStatus.STOPPED, now=self.clock.now()), attempts=3)
            self._log(logging.INFO, "worker stopped", executed=self.executed - executed_before)
            if restore:
                restore()
        return self.executed - executed_before

    def _retry_db(self, fn: Callable[[], Any], attempts: int | None = None) -> None:
        delay = 0.5
        tries = 0
        while True:
            try:
                fn()
                return
            except TRANSIENT_DB_ERRORS as exc:
                tries += 1
                self._reset_connection()
                if (attempts is not None and tries >= attempts) or self._hard_stop:
                    self._log(logging.ERROR, "database unavailable", error=describe_exception(exc))
                    return
                self._log(logging.WARNING, "database unavailable; retrying", error=describe_exception(exc),
                          retry_in=f"{delay:.1f}")
                time.sleep(delay)
                delay = min(delay * 2, MAX_DB_BACKOFF_SECONDS)

    @staticmethod
    def _reset_connection() -> None:
        try:
            if connection.in_atomic_block:
                return
            connection.close()
        except DatabaseError:
            pass

    # -- heartbeat thread --------------------------------------------------------

    @contextmanager
    def _heartbeat_running(self) -> Iterator[None]:
        if self._heartbeat_thread is not None:
            yield
            return
        self._heartbeat_stop.clear()
        thread = threading.Thread(target=self._heartbeat_loop, name=f"distsched-heartbeat-{self.worker_id}",
                                  daemon=True)
        self._heartbeat_thread = thread
        thread.start()
        try:
            yield
        finally:
            self._heartbeat_stop.set()
            thread.join(timeout=self.heartbeat_seconds + 5)
            self._heartbeat_thread = None

    def _heartbeat_loop(self) -> None:
        try:
            while not self._heartbeat_stop.wait(self.heartbeat_seconds):
                try:
                    self.heartbeat()
                except Exception as exc:  # noqa: BLE001 - the heartbeat must outlive DB hiccups
                    self._log(logging.WARNING, "heartbeat failed", error=describe_exception(exc))
                    self._reset_connection()
        finally:
            close_old_connections()
            connection.close()

    # -- signals -----------------------------------------------------------------

    def _install_signals(self) -> Callable[[], None] | None:
        if threading.current_thread() is not threading.main_thread():
            return None
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

        def handler(signum: int, frame: Any) -> None:
            if self._stop.is_set():
                # Second signal: leave now. The lease expiry recovers the current run.
                self._hard_stop = True
                sys.stderr.write(f"distsched: second {signal.Signals(signum).name}, exiting now\n")
                sys.stderr.flush()
                os._exit(1)
            self._stop.set()
            self._log(logging.INFO, "stop requested; finishing current run", signal=signal.Signals(signum).name)

        for sig in previous:
            signal.signal(sig, handler)

        def restore() -> None:
            for sig, old in previous.items():
                signal.signal(sig, old)

        return restore

    def _log(self, level: int, message: str, **fields: Any) -> None:
        if logger.isEnabledFor(level):
            data = {"worker_id": self.worker_id}
            data.update({k: v for k, v in fields.items() if v is not None})
            logger.log(level, message, extra={"distsched": data})
