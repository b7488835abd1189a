"""The heartbeat: a thread that keeps the worker row fresh and the leases it holds alive.

Every ``heartbeat_seconds``, also while idle, it upserts the worker row (and
re-registers if an operator's prune deleted it), renews the lease of every run
held, current and prefetched (fenced: a lease lost meanwhile is noticed, not
renewed), learns of cancel requests, and shows a prefetched run that has been
executing a while as ``running``. If the process dies the heartbeat stops with
it, and the lease deadline, not the heartbeat, decides when another worker may
take the runs. Nothing that fails here stops the worker: the next beat tries again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from django.db import close_old_connections, connection

from ..db.retry import is_transient, reset_connection
from ..models import WorkerStatus
from ..services import outcomes, workers
from .execute import describe_exception

if TYPE_CHECKING:
    from . import Worker


class Heartbeat:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def beat(self) -> None:
        """One heartbeat, now (the thread's body; tests call it directly)."""
        with self.worker.recorder.lock:
            self._beat()

    def _beat(self) -> None:
        w = self.worker
        now = w.clock.now()
        held = w.held.leases()
        executing = w.held.executing()
        alive = workers.heartbeat(
            worker_id=w.worker_id,
            now=now,
            status=WorkerStatus.STOPPING if w.stopping else None,
            current_run_id=executing[0].run_id if executing else None,
            runs_executed=w.executed,
            clock_skew_seconds=w.check_clock_skew(),
        )
        if not alive:
            w.register()
        if not held:
            return
        try:
            renewal = outcomes.renew_leases(worker_id=w.worker_id, held=held, now=now, lease_seconds=w.lease_seconds)
        except Exception as exc:  # noqa: BLE001 - the next heartbeat tries again; expiry is the backstop
            w.log(
                logging.WARNING,
                "could not renew leases",
                run_id=",".join(map(str, sorted(held))),
                error=describe_exception(exc),
            )
            if is_transient(exc):
                reset_connection()
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
            while not self._stop.wait(self.worker.heartbeat_seconds):
                try:
                    self.beat()
                except Exception as exc:  # noqa: BLE001 - the heartbeat must outlive DB hiccups
                    self.worker.log(logging.WARNING, "heartbeat failed", error=describe_exception(exc))
                    reset_connection()
        finally:
            close_old_connections()
            connection.close()
