"""What a campaigning process does each turn: elect, and, while it leads, tick and run the chores.

``tick --loop`` and ``runworker --with-tick`` both call ``Leadership.turn``. The
leader's writes are fenced by its term (the tick, retention), so a deposed
leader's turn raises ``NotLeader`` before writing, and it steps down. The chores:

- the tick (every turn);
- the flow-control sweep (``limits.sweep``, every ``SWEEP_SECONDS``): idempotent,
  so it needs no fence; workers run it themselves only while nobody leads;
- the stored operator figures (``figures.refresh``, every ``FIGURES_SECONDS``): the stalest one
  older than 15 s is computed again, so ``/metrics``, ``/api/stats`` and the dashboard read them
  instead of counting a large history. In ``tick --loop`` and ``runworker --with-tick`` they are
  refreshed by a thread of their own (``FigureRefresher``), never on the tick's path: one figure
  takes up to 1.8 s at eleven million runs, which the next tick would otherwise wait for. A figure
  is not a leader-only write (any reader stores one it found stale), so it needs no fence; the
  thread only works while its process leads;
- retention (``DISTSCHED["RETENTION"]``), in batches for at most half a second
  per turn while old runs remain (the next turn goes on), else once a minute; its
  figures are logged once a minute while it deletes.

Expired leases need no chore: every worker's claim recovers them (``claiming``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime

from django.db import connections

from ..db.retry import reset_connection
from ..errors import NotLeader
from . import figures, limits, retention, workflow_release
from . import queue_stats as _queue_stats  # noqa: F401 - registers its figures
from . import stats as _stats  # noqa: F401 - registers its figures
from .leader import Elector, Store
from .tick import NewRun, tick

logger = logging.getLogger("distsched")

RETENTION_IDLE_SECONDS = 60.0
FIGURES_SECONDS = 1.0
REPORT_EVERY_SECONDS = 60.0


class FigureRefresher:
    """Refreshes the stored figures (``figures.refresh``) in a daemon thread, every ``every`` seconds
    while ``leading()`` says this process leads, so that the tick never waits for a figure.

    The thread has its own database connection (closed when it stops, and after an error, which is
    logged and tried again at the next beat). ``refresh`` and ``now`` are injected for tests.
    """

    def __init__(
        self,
        *,
        leading: Callable[[], bool],
        now: Callable[[], datetime],
        refresh: Callable[[datetime], object] = figures.refresh,
        every: float = FIGURES_SECONDS,
    ) -> None:
        self.leading = leading
        self.now = now
        self.refresh = refresh
        self.every = every
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread (once; again after ``stop``)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._serve, name="distsched-figures", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> bool:
        """Ask the thread to stop and wait up to ``timeout`` s (a figure being computed finishes
        first). Returns whether it stopped."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def _serve(self) -> None:
        try:
            while not self._stop.wait(self.every):
                if self.leading():
                    self.beat()
        finally:
            connections.close_all()  # this thread's connections

    def beat(self) -> None:
        """One refresh (what the thread does each ``every`` s while leading); errors are logged."""
        try:
            self.refresh(self.now())
        except Exception as exc:  # noqa: BLE001 - a figure never stops the leader; tried again next beat
            logger.warning(
                "stored figure refresh failed; trying again",
                extra={"distsched": {"error": f"{type(exc).__name__}: {exc}"}},
            )
            reset_connection()


class Leadership:
    """``figures_clock``: refresh the stored figures in a ``FigureRefresher`` thread reading this
    clock (``tick --loop``, ``runworker --with-tick``); None: each turn refreshes one itself, after its
    tick (one-process tests with a fake monotonic clock)."""

    def __init__(
        self,
        *,
        holder: str,
        lease_seconds: float | None = None,
        store: Store | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        figures_clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.monotonic = monotonic
        self.elector = Elector(holder=holder, lease_seconds=lease_seconds, store=store, monotonic=monotonic)
        self.figures: FigureRefresher | None = None
        if figures_clock is not None:
            self.figures = FigureRefresher(leading=self.elector.leading, now=figures_clock)
        self.retention = retention.Retention(monotonic=monotonic)
        self.next_sweep = 0.0
        self.next_workflow_sweep = 0.0
        self.next_retention = 0.0
        self.next_figures = 0.0
        self._deleted = [0, 0]  # runs, events since the last report
        self._report_from = monotonic()

    def turn(self, now: datetime) -> list[NewRun] | None:
        """Elect; if leading, tick and run the due chores. None when this process does not lead."""
        if not self.elector.step():
            return None
        if self.figures is not None:
            self.figures.start()  # idles while this process does not lead
        try:
            created = tick(now=now, fence=self.elector.term)
            self._chores(now)
        except NotLeader as exc:
            self.elector.step_down(f"fenced out: {exc}")
            return None
        return created

    def wait_seconds(self, interval: float) -> float:
        """How long the caller may sleep: its tick interval, shorter if the election needs a turn
        sooner, and none while retention has a backlog."""
        wait = min(interval, self.elector.wait_seconds())
        if self.elector.term is not None:
            wait = min(wait, max(0.0, self.next_retention - self.monotonic()))
        return wait

    def stop(self) -> None:
        if self.figures is not None and not self.figures.stop():
            logger.warning("the stored figures' thread is still computing one; not waiting for it")
        self._report(force=True)
        self.elector.resign()

    def _chores(self, now: datetime) -> None:
        mono = self.monotonic()
        if mono >= self.next_sweep and self.elector.leading():
            self.next_sweep = mono + limits.SWEEP_SECONDS
            limits.sweep(now)
        if mono >= self.next_workflow_sweep and self.elector.leading():  # nodes a missed transition left waiting
            self.next_workflow_sweep = mono + workflow_release.SWEEP_SECONDS
            workflow_release.sweep(now)
        if self.figures is None and mono >= self.next_figures and self.elector.leading():
            self.next_figures = mono + FIGURES_SECONDS
            figures.refresh(now)
        if mono >= self.next_retention and self.elector.leading():
            done = self.retention.apply(now, fence=self.elector.term)
            self._deleted[0] += done.runs
            self._deleted[1] += done.events
            # A backlog: go on at the next turn; else look again in a minute.
            self.next_retention = self.monotonic() + (0.0 if done.more else RETENTION_IDLE_SECONDS)
        self._report()

    def _report(self, *, force: bool = False) -> None:
        """Log what retention deleted, and how fast, once a minute while it deletes."""
        elapsed = self.monotonic() - self._report_from
        if not force and elapsed < REPORT_EVERY_SECONDS:
            return
        runs, events = self._deleted
        if runs:
            logger.info(
                "retention deleted runs",
                extra={
                    "distsched": {
                        "runs": runs,
                        "events": events,
                        "seconds": round(elapsed, 1),
                        "rows_per_second": round((runs + events) / elapsed, 1) if elapsed > 0 else None,
                    }
                },
            )
        self._deleted = [0, 0]
        self._report_from = self.monotonic()
