"""The heartbeat: a thread that keeps the worker row fresh and the leases it holds alive.

Every ``heartbeat_seconds`` (shortened by a random jitter), also while idle, it
moves the worker row (and re-registers if an operator's prune deleted it) and
renews the lease of every run held, current and prefetched (fenced: a lease lost
meanwhile is noticed, not renewed), both in one transaction (one statement on
PostgreSQL), learns of cancel requests, and shows a prefetched run that has been
executing a while as ``running``. If the process dies the heartbeat stops with
it, and the lease deadline, not the heartbeat, decides when another worker may
take the runs. Nothing that fails here stops the worker: the next beat tries again.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from django.db import close_old_connections, connection

from ..db.heartbeat import RowBeat
from ..db.retry import is_transient, reset_connection
from ..models import WorkerStatus
from ..services import outcomes
from .execute import describe_exception
from .pacing import jittered

if TYPE_CHECKING:
    from . import Worker


# How often the clock skew with the database is measured (one query), at most.
SKEW_CHECK_SECONDS = 60.0


class Heartbeat:
    def __init__(self, worker: Worker, rand: Callable[[], float] = random.random) -> None:
        self.worker = worker
        self.rand = rand  # the jitter's draws (tests inject their own)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._next_skew_check = 0.0  # monotonic time: the clock skew is measured about once a minute

    def interval(self) -> float:
        """The wait before the next beat: ``HEARTBEAT_SECONDS`` shortened by up to ``HEARTBEAT_JITTER``
        (``pacing.jittered``), so a fleet started together does not beat in lockstep."""
        return jittered(self.worker.heartbeat_seconds, self.worker.heartbeat_jitter, self.rand)

    def _skew(self) -> float | None:
        """The clock skew to store with this beat: measured (one query) about once a minute, not on
        every beat: clocks drift slowly, and at a thousand workers a query per beat is a cost."""
        if time.monotonic() < self._next_skew_check:
            return None
        self._next_skew_check = time.monotonic() + SKEW_CHECK_SECONDS
        return self.worker.check_clock_skew()

    def beat(self) -> None:
        """One heartbeat, now (the thread's body; tests call it directly)."""
        with self.worker.recorder.lock:
            self._beat()

    def _beat(self) -> None:
        w = self.worker
        now = w.clock.now()
        held = w.held.leases()
        executing = w.held.executing()
        row = RowBeat(
            heartbeat_at=now,
            status=WorkerStatus.STOPPING if w.stopping else None,
            current_run_id=executing[0].run_id if executing else None,
            runs_executed=w.executed,
            clock_skew_seconds=self._skew(),
        )
        try:  # the worker row and every lease held: one transaction (one statement on PostgreSQL)
            renewal = outcomes.renew_leases(
                worker_id=w.worker_id, held=held, now=now, lease_seconds=w.lease_seconds, row=row
            )
        except Exception as exc:
            if not held:
                raise  # the loop logs it ("heartbeat failed") and tries again at the next beat
            w.log(
                logging.WARNING,
                "could not renew leases",
                run_id=",".join(map(str, sorted(held))),
                error=describe_exception(exc),
            )
            if is_transient(exc):
                reset_connection()
            return
        if renewal.alive is False:
            w.register()
        if not held:
            return
        for run_id in w.held.note_lost(set(held) - renewal.held):
            w.log(logging.WARNING, "lease lost while holding run", run_id=run_id, attempt=held[run_id])
        w.held.note_cancel_requested(renewal.cancel_requested)
        for attempt in executing:
            if attempt.started_recorded or attempt.started_at is None:
                continue
            try:
                marked = outcomes.mark_running(
                    run_id=attempt.run_id,
                    worker_id=w.worker_id,
                    attempt=attempt.number,
                    started_at=attempt.started_at,
                    now=now,
                )
            except Exception as exc:  # noqa: BLE001 - the success or failure records the start anyway
                w.log(
                    logging.WARNING,
                    "could not mark run as running",
                    run_id=attempt.run_id,
                    error=describe_exception(exc),
                )
                marked = False
            if marked:
                attempt.started_recorded = True

    @contextmanager
    def running(self) -> Iterator[None]:
        """The heartbeat thread, for the duration of the block (re-entrant)."""
        if self._thread is not None:
            yield
            return
        self._stop.clear()
        thread = threading.Thread(target=self._loop, name=f"distsched-heartbeat-{self.worker.worker_id}", daemon=True)
        self._thread = thread
        thread.start()
        try:
            yield
        finally:
            self._stop.set()
            thread.join(timeout=self.worker.heartbeat_seconds + 5)
            self._thread = None

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.interval()):
                try:
                    self.beat()
                except Exception as exc:  # noqa: BLE001 - the heartbeat must outlive DB hiccups
                    self.worker.log(logging.WARNING, "heartbeat failed", error=describe_exception(exc))
                    reset_connection()
        finally:
            close_old_connections()
            connection.close()
