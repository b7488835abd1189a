"""Helpers for your own tests: run schedules and enqueued runs in-process, on a clock you move.

    from distsched_app.testing import drain, fake_clock

    with fake_clock("2026-03-02T09:00:00+00:00") as clock:
        send_reminder.enqueue(42)               # django.tasks, backend distsched
        done = drain()                          # due schedules ticked, every due run executed
        assert done.succeeded == 1

``drain`` is a real worker, in the calling thread, on the calling thread's
database connection: runs get what production gives them (attempts, retries
with backoff, history, signals, distsched's context extras), inside a Django
``TestCase`` (its open transaction) as well as outside, on SQLite and
PostgreSQL, sync and async tasks alike. pytest fixtures over these helpers:
``distsched_app.pytest_plugin``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime

from .clock import Clock, FakeClock, current_clock, use_clock
from .errors import DistschedError
from .models import RunState
from .registry import TaskRegistry
from .services import tick as tick_service
from .worker import Execution, Worker
from .worker.execute import async_in_calling_thread

__all__ = ["DrainLimitReached", "Drained", "UnknownTaskInTest", "drain", "fake_clock"]

MAX_RUNS = 1000
QUIET_HEARTBEAT_SECONDS = 3600.0  # the worker's heartbeat thread never wakes during a test


class DrainLimitReached(DistschedError):
    """More runs kept coming due than ``drain(max_runs=...)`` allows (a task that enqueues itself?)."""


class UnknownTaskInTest(DistschedError):
    """A run names a task this process has not registered (is its app in INSTALLED_APPS?)."""


@dataclass(frozen=True, kw_only=True)
class Drained:
    """What one ``drain()`` did: the runs the tick created and every execution, in order."""

    created: int = 0
    executions: list[Execution] = field(default_factory=list)

    def _count(self, state: str) -> int:
        return sum(1 for e in self.executions if e.state == state)

    @property
    def succeeded(self) -> int:
        return self._count(RunState.SUCCEEDED)

    @property
    def retrying(self) -> int:
        """Failed attempts that will be retried (advance the clock past the backoff and drain again)."""
        return self._count(RunState.RETRYING)

    @property
    def dead(self) -> int:
        return self._count(RunState.DEAD)

    @property
    def errors(self) -> list[str]:
        """The error of each failed attempt (``"ValueError: boom"``)."""
        return [e.error for e in self.executions if e.error]


def drain(
    *,
    clock: Clock | None = None,
    queues: Sequence[str] = ("*",),
    tick: bool = True,
    max_runs: int = MAX_RUNS,
    worker_id: str = "distsched-test",
    registry: TaskRegistry | None = None,
) -> Drained:
    """Tick due schedules and execute every due run, in this thread, until nothing is due.

    ``clock`` defaults to the current one (``fake_clock`` installs a fake); runs whose time has
    not come (a retry's backoff, a later slot) stay for the next drain, after the clock moved.
    Every queue is served unless ``queues`` says otherwise. Runs enqueued by the tasks
    themselves are drained too, up to ``max_runs`` executions (then ``DrainLimitReached``).
    A run of a task this process has not registered raises ``UnknownTaskInTest``.
    Async tasks are awaited on this thread's connection (``async_in_calling_thread``).
    """
    clock = clock or current_clock()
    worker = Worker(
        worker_id=worker_id,
        queues=list(queues),
        clock=clock,
        registry=registry,
        heartbeat_seconds=QUIET_HEARTBEAT_SECONDS,
        prefetch=1,
    )
    created = 0
    executions: list[Execution] = []
    with async_in_calling_thread():
        while True:
            if tick:
                created += len(tick_service.tick(now=clock.now()))
            execution = worker.run_once()
            if execution is None:
                break
            if worker.guard.skipped():
                names = ", ".join(worker.guard.skipped())
                raise UnknownTaskInTest(f"no task registered as {names}: is its app in INSTALLED_APPS?")
            executions.append(execution)
            if len(executions) >= max_runs:
                raise DrainLimitReached(f"drain executed {max_runs} runs and more are due")
    return Drained(created=created, executions=executions)


@contextmanager
def fake_clock(start: datetime | str = "2026-01-01T00:00:00+00:00") -> Iterator[FakeClock]:
    """A ``FakeClock`` installed as the clock everything reads (services, the backend, the API,
    the admin, commands, ``drain``) for the block: move it with ``set()`` and ``advance()``."""
    clock = FakeClock(start)
    with use_clock(clock):
        yield clock
