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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction

from ..db import locks
from ..errors import ValidationError
from ..models import TERMINAL_STATES, Run, RunEvent, RunQuerySet, Worker
from . import workflow_prune

DEFAULT_BATCH_SIZE = 1000
MAX_BATCH_SIZE = 50_000


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


def prunable_runs(cutoff: datetime) -> RunQuerySet:
    """Finished runs older than ``cutoff``: terminal state and ``finished_at`` before it. Runs of
    workflows are not among them: a workflow is pruned whole (``workflow_prune``)."""
    return Run.objects.filter(state__in=TERMINAL_STATES, finished_at__lt=cutoff, workflow__isnull=True)


def prune_runs(
    *,
    older_than: timedelta,
    now: datetime,
    batch_size: int = DEFAULT_BATCH_SIZE,
    dry_run: bool = False,
    progress: Callable[[PruneProgress], None] | None = None,
) -> PruneResult:
    """Delete finished runs (and their events) that finished before ``now - older_than``.

    Also deletes workers whose last heartbeat is older than the cutoff: stopped
    workers, and workers that died without saying so (a worker that is alive
    heartbeats every few seconds, and re-registers if its row is gone).

    ``progress`` (not called on a dry run) is told where the prune stands after
    each batch; a ``KeyboardInterrupt`` it raises stops the prune between batches
    (``PruneInterrupted``).
    """
    if not isinstance(older_than, timedelta) or older_than < timedelta(0):
        raise ValidationError("older_than must be a non-negative duration", field="older_than")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise ValidationError(f"batch_size must be between 1 and {MAX_BATCH_SIZE}", field="batch_size")
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
        last_id: int | None = 0
        while last_id is not None:
            if progress is not None:
                progress(
                    PruneProgress(runs=total_runs, events=total_events, batches=batches, total=total, cutoff=cutoff)
                )
            deleted_runs, deleted_events, last_id = _prune_batch(cutoff, batch_size, last_id)
            if last_id is None:
                break
            batches += 1
            total_runs += deleted_runs
            total_events += deleted_events
        flows, last_id = 0, 0
        while last_id is not None:
            deleted_flows, deleted_runs, deleted_events, last_id = workflow_prune.prune_batch(
                cutoff, batch_size, last_id
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


def _prune_batch(cutoff: datetime, batch_size: int, after_id: int) -> tuple[int, int, int | None]:
    """One short transaction: lock up to ``batch_size`` prunable runs, delete their events, then them.

    Returns (runs deleted, events deleted, highest id seen), or a None id when
    nothing is left. Walking by id guarantees progress even if a row is skipped.
    """
    with transaction.atomic():
        # The row lock makes an operator's concurrent requeue of one of these
        # runs wait for us (and then find it gone) instead of reviving a run
        # whose history we are deleting. SQLite needs none: BEGIN IMMEDIATE
        # already holds the database write lock for the whole batch.
        qs = locks.skip_locked(prunable_runs(cutoff).filter(pk__gt=after_id).order_by("pk"))
        ids = list(qs.values_list("pk", flat=True)[:batch_size])
        if not ids:
            return 0, 0, None
        events, _ = RunEvent.objects.filter(run_id__in=ids).delete()
        # ``only("pk")``: the delete collector needs no payloads, results or errors.
        _, per_model = Run.objects.filter(pk__in=ids).only("pk").delete()
        runs = per_model.get(Run._meta.label, 0)
    return runs, events, ids[-1]
