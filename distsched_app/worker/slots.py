"""Where the loop's tasks run: inline in the loop's thread (one slot) or on a pool of N threads.

Both offer the loop the same four calls: how many slots are ``free``, whether any
is ``busy``, ``start`` a claimed batch, ``collect`` (record) what finished.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import TYPE_CHECKING

from django.db import close_old_connections

from . import frameworks
from .execute import Attempt

if TYPE_CHECKING:
    from .loop import Loop


class InlineSlots:
    """One slot: the loop's own thread runs each task as it is started."""

    inline = True

    def __init__(self, loop: Loop) -> None:
        self.loop = loop

    def free(self) -> int:
        return 1

    def busy(self) -> bool:
        return False

    def start(self, attempts: list[Attempt]) -> None:
        w = self.loop.worker
        frameworks.mark_batch_started(w, attempts)  # framework results read RUNNING while they execute
        for index, attempt in enumerate(attempts):
            if index > 0 and w.stopping:
                w.recorder.release_unstarted(attempts[index:])
                return
            self.loop.execute(attempt, flush=False)
            if w.recorder.flush_due():
                w.recorder.flush()

    def collect(self, timeout: float) -> None:
        pass  # everything started has finished


class PoolSlots:
    """N slots: a thread pool; ``collect`` records the tasks that finished."""

    inline = False

    def __init__(self, loop: Loop, pool: ThreadPoolExecutor, size: int) -> None:
        self.loop = loop
        self.pool = pool
        self.size = size
        self.running: dict[Future[None], Attempt] = {}

    def free(self) -> int:
        return self.size - len(self.running)

    def busy(self) -> bool:
        return bool(self.running)

    def start(self, attempts: list[Attempt]) -> None:
        for attempt in attempts:
            self.running[self.pool.submit(self._call, attempt)] = attempt

    def _call(self, attempt: Attempt) -> None:
        try:
            self.loop.call(attempt)
        finally:
            close_old_connections()

    def collect(self, timeout: float) -> None:
        if not self.running:
            return
        worker = self.loop.worker
        # With a slot free, wait in short slices, so a wake-up claims at once rather than after `timeout`.
        step = timeout if not self.free() else min(timeout, 0.05)
        deadline = time.monotonic() + timeout
        while True:
            done, _ = wait(list(self.running), timeout=step, return_when=FIRST_COMPLETED)
            if done or time.monotonic() >= deadline or (self.free() and worker.take_wake()):
                break
        for future in done:
            self.loop.worker.recorder.finish(self.running.pop(future), flush=False)


@contextmanager
def task_slots(loop: Loop) -> Iterator[InlineSlots | PoolSlots]:
    """One inline slot for a worker of concurrency 1, else a pool of that many threads."""
    size = loop.worker.concurrency
    if size == 1:
        yield InlineSlots(loop)
        return
    with ThreadPoolExecutor(max_workers=size, thread_name_prefix="distsched-task") as pool:
        yield PoolSlots(loop, pool, size)
