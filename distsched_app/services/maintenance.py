"""Maintenance: prune old history so the runs and events tables stay small.

Only finished runs (terminal states) whose ``finished_at`` is older than the
cutoff are deleted, with their events; a pending, retrying, leased or running
run is never touched, whatever its age. Deletion goes in small batches, each
its own short transaction, so pruning a million rows never holds a long lock
that would stall claims and ticks.

A caller that shows progress passes ``progress``: the prunable runs are counted
first (one count over the ``finished_at`` index), and it is called before the
first batch and after each committed one. Ctrl-C (``KeyboardInterrupt``, from
the callback or from anywhere inside) becomes ``PruneInterrupted``, which says
what the committed batches deleted; the batch in flight rolls back whole.

A prune can pace itself: after each batch it rests ``pause`` times as long as the batch
took (``DEFAULT_PAUSE``: none), so that a long prune leaves the database's CPU, disk and WAL
a larger share for the claims beside it; a batch slowed by contention earns a longer rest.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction

from ..db import locks, run_delete
from ..db.leader import Term
from ..errors import ValidationError
from ..models import TERMINAL_STATES, Run, RunEvent, RunQuerySet, Worker
from . import leader, workflow_prune

DEFAULT_BATCH_SIZE = 1000
MAX_BATCH_SIZE = 50_000
# The rest after each batch, as a fraction of the batch's time. None by default: at 3.3M runs a rest
# of 0.25 or 0.5 left the claims' p99 beside a prune where it was and cut the prune's rate by a quarter
# to two fifths (docs/postgresql.md, "Why claims slow down beside a long prune").
DEFAULT_PAUSE = 0.0
MAX_PAUSE = 10.0


@dataclass(frozen=True, kw_only=True)
class PruneResult:
    """What was (or, with ``dry_run``, would be) deleted."""

    runs: int
    events: int
    workers: int
    cutoff: datetime
    dry_run: bool
    batches: int = 0
    workflows: int = 0  # finished workflows deleted whole (their runs and events are in runs, events)


@dataclass(frozen=True, kw_only=True)
class PruneProgress:
    """Where a prune stands: what the committed batches deleted, out of ``total``.

    ``total`` is the count taken before the first batch: runs finishing or pruned
    by someone else meanwhile make it an estimate, so ``runs`` may end above or below it.
    """

    runs: int
    events: int
    batches: int
    total: int
    cutoff: datetime


class PruneInterrupted(KeyboardInterrupt):
    """Ctrl-C during a prune. ``done`` is what the batches committed before it deleted
    (no worker rows: those go last); the batch in flight rolled back, nothing is half-deleted.
    A KeyboardInterrupt still, so code that knows nothing of it stops as before."""

    def __init__(self, done: PruneResult) -> None:
        super().__init__(f"prune interrupted after {done.runs} run(s)")
        self.done = done


def is_prunable(runs: RunQuerySet) -> RunQuerySet:
    """The one rule of what history may be deleted run by run, for ``prune`` and retention alike:
    of these finished runs, the ones no one still needs. Runs of workflows are not among them: a
    workflow is pruned whole, once finished (``workflow_prune``), so a live workflow never loses a
    part. The schedule audit lives in its own table and is never touched here.
    """
    return runs.filter(workflow__isnull=True)


def prunable_runs(cutoff: datetime, states: Sequence[str] = TERMINAL_STATES) -> RunQuerySet:
    """Finished runs older than ``cutoff``: a terminal state (of ``states``) and ``finished_at`` before it."""
    finished = [state for state in states if state in TERMINAL_STATES]  # never an active run, whoever asks
    return is_prunable(Run.objects.filter(state__in=finished, finished_at__lt=cutoff))


def prune_runs(
    *,
    older_than: timedelta,
    now: datetime,
    batch_size: int = DEFAULT_BATCH_SIZE,
    dry_run: bool = False,
    progress: Callable[[PruneProgress], None] | None = None,
    pause: float = DEFAULT_PAUSE,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> PruneResult:
    """Delete finished runs (and their events) that finished before ``now - older_than``.

    Also deletes workers whose last heartbeat is older than the cutoff: stopped
    workers, and workers that died without saying so (a worker that is alive
    heartbeats every few seconds, and re-registers if its row is gone).

    ``progress`` (not called on a dry run) is told where the prune stands after
    each batch; a ``KeyboardInterrupt`` it raises stops the prune between batches
    (``PruneInterrupted``). After each batch it ``sleep``s ``pause`` times the batch's
    time by ``monotonic`` (0: no rest).
    """
    if not isinstance(older_than, timedelta) or older_than < timedelta(0):
        raise ValidationError("older_than must be a non-negative duration", field="older_than")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise ValidationError(f"batch_size must be between 1 and {MAX_BATCH_SIZE}", field="batch_size")
    pace = Pacer(pause, sleep=sleep, monotonic=monotonic)
    try:
        cutoff = now - older_than
    except OverflowError:
        raise ValidationError("older_than reaches before year 1", field="older_than") from None
    old_workers = Worker.objects.filter(heartbeat_at__lt=cutoff)
    if dry_run:
        runs = prunable_runs(cutoff)
        flows, flow_runs, flow_events = workflow_prune.counts(cutoff)
        return PruneResult(
            runs=runs.count() + flow_runs,
            events=RunEvent.objects.filter(run__in=runs.values("pk")).count() + flow_events,
            workers=old_workers.count(),
            cutoff=cutoff,
            dry_run=True,
            workflows=flows,
        )
    total_runs = total_events = batches = 0
    try:
        # Counted only for a caller that shows progress: the count is its ETA's denominator.
        total = prunable_runs(cutoff).count() if progress is not None else 0
        # Every final state in one walk along the finished_at index, oldest first: each page of the
        # two tables is visited once. A walk per state (as retention's, whose ages differ) came
        # back to the same pages for the dead and cancelled runs after the succeeded ones; in a
        # prune that spans checkpoints those pages were logged whole (full-page images) and written
        # again (7% more WAL for 25 days of 3.3M runs: docs/postgresql.md).
        if progress is not None:
            progress(PruneProgress(runs=0, events=0, batches=0, total=total, cutoff=cutoff))
        candidates = prunable_runs(cutoff)
        after: Cursor = None
        while True:
            with pace:
                deleted_runs, deleted_events, after = delete_batch(candidates, batch_size, after)
            if after is None:
                break
            batches += 1
            total_runs += deleted_runs
            total_events += deleted_events
            if progress is not None:
                progress(
                    PruneProgress(runs=total_runs, events=total_events, batches=batches, total=total, cutoff=cutoff)
                )
        flows = 0
        last_flow_id: int | None = 0
        while last_flow_id is not None:
            with pace:
                deleted_flows, deleted_runs, deleted_events, last_flow_id = workflow_prune.prune_batch(
                    cutoff, batch_size, last_flow_id
                )
            flows += deleted_flows
            total_runs += deleted_runs
            total_events += deleted_events
        with transaction.atomic():
            workers, _ = old_workers.delete()
    except KeyboardInterrupt:
        # Raised inside a batch, its transaction rolled back: the totals are the committed batches'
        # (short by one only if the interrupt lands between a batch's COMMIT and its return).
        done = PruneResult(
            runs=total_runs, events=total_events, workers=0, cutoff=cutoff, dry_run=False, batches=batches
        )
        raise PruneInterrupted(done) from None
    return PruneResult(
        runs=total_runs, events=total_events, workers=workers, cutoff=cutoff, dry_run=False, batches=batches,
        workflows=flows,
    )  # fmt: skip


class Pacer:
    """``with pacer:`` around a batch rests ``pause`` times the batch's time after it (the batch
    that finds nothing left rests too, briefly). A rest is a ``sleep`` between transactions:
    nothing is held meanwhile."""

    def __init__(
        self,
        pause: float,
        *,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(pause, bool) or not isinstance(pause, int | float) or not 0 <= pause <= MAX_PAUSE:
            raise ValidationError(f"pause must be between 0 and {MAX_PAUSE:g} (times a batch's time)", field="pause")
        self.pause = float(pause)
        self.sleep = sleep
        self.monotonic = monotonic
        self.rested = 0.0  # seconds, in all
        self._started = 0.0

    def __enter__(self) -> Pacer:
        self._started = self.monotonic()
        return self

    def __exit__(self, kind: object, *_: object) -> None:
        if kind is not None or not self.pause:
            return  # an error or an interrupt goes on at once
        rest = (self.monotonic() - self._started) * self.pause
        if rest > 0:
            self.rested += rest
            self.sleep(rest)


# Where a walk over finished runs stands: the finished_at of the last run it deleted.
Cursor = datetime | None


def delete_batch(
    candidates: RunQuerySet, batch_size: int, after: Cursor, *, fence: Term | None = None
) -> tuple[int, int, Cursor]:
    """One short transaction: lock up to ``batch_size`` of ``candidates`` (finished runs, oldest
    first, from the cursor on), delete their events, then them. ``fence``: the leader's term,
    checked first in the same transaction (``leader.fenced``: ``NotLeader``, nothing deleted).

    Returns (runs deleted, events deleted, the new cursor), or a None cursor when nothing is
    left. The walk reads a ``finished_at`` index in order from the cursor and stops after
    ``batch_size`` rows (no sort), never past the cutoff, so it never reads the retained
    history. Every run a batch returns is deleted by it, so the next batch, starting at the
    same instant, cannot return it again; the cursor only skips what lies behind it (runs
    another transaction had locked, left for the next walk).
    """
    with leader.fenced(fence):
        # The row lock makes an operator's concurrent requeue of one of these
        # runs wait for us (and then find it gone) instead of reviving a run
        # whose history we are deleting. SQLite needs none: BEGIN IMMEDIATE
        # already holds the database write lock for the whole batch. Only finished
        # runs are locked: no claim ever waits for a prune.
        qs = candidates.order_by("finished_at")
        if after is not None:
            qs = qs.filter(finished_at__gte=after)
        locked = locks.skip_locked(qs).values_list("pk", "finished_at")[:batch_size]
        one_statement = run_delete.statement(locked)
        if one_statement is not None:  # PostgreSQL: the batch in one round trip
            runs, events, latest = run_delete.run(*one_statement)
            return (runs, events, latest) if runs else (0, 0, None)
        rows = list(locked)
        if not rows:
            return 0, 0, None
        ids = [pk for pk, _ in rows]
        events, _ = RunEvent.objects.filter(run_id__in=ids).delete()
        # ``only("pk")``: the delete collector needs no payloads, results or errors.
        _, per_model = Run.objects.filter(pk__in=ids).only("pk").delete()
        runs = per_model.get(Run._meta.label, 0)
    return runs, events, rows[-1][1]
