"""Prune whole workflows: a finished workflow (every node ended) older than the cutoff goes with
all its runs, their events, its nodes and edges, in one short transaction per batch; never a
part of a live one. ``maintenance.prune_runs`` leaves workflow runs alone and calls this."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from ..db import locks
from ..models import TERMINAL_STATES, Run, RunEvent, Workflow, WorkflowEdge, WorkflowNode


def prunable(cutoff: datetime):
    return Workflow.objects.filter(finished_at__lt=cutoff)


def counts(cutoff: datetime) -> tuple[int, int, int]:
    """(workflows, runs, events) a prune would delete."""
    ids = prunable(cutoff).values("pk")
    runs = Run.objects.filter(workflow_id__in=ids)
    return prunable(cutoff).count(), runs.count(), RunEvent.objects.filter(run__in=runs.values("pk")).count()


def prune_batch(cutoff: datetime, batch_size: int, after_id: int) -> tuple[int, int, int, int | None]:
    """Delete up to ``batch_size`` finished workflows (ids above ``after_id``) whole. Returns
    (workflows, runs, events deleted, the highest id seen or None when nothing is left)."""
    with transaction.atomic():
        qs = locks.skip_locked(prunable(cutoff).filter(pk__gt=after_id).order_by("pk"))
        ids = list(qs.values_list("pk", flat=True)[:batch_size])
        if not ids:
            return 0, 0, 0, None
        # Locked, then checked: a node requeued meanwhile makes its workflow live again (kept).
        rows = list(locks.row_locked(Run.objects.filter(workflow_id__in=ids).order_by("id")).values_list(
            "id", "workflow_id", "state"
        ))  # fmt: skip
        live = {w for _, w, state in rows if state not in TERMINAL_STATES}
        done = [w for w in ids if w not in live]
        run_ids = [r for r, w, _ in rows if w not in live]
        events, _ = RunEvent.objects.filter(run_id__in=run_ids).delete()
        WorkflowEdge.objects.filter(downstream_id__in=run_ids).delete()
        WorkflowNode.objects.filter(run_id__in=run_ids).delete()
        _, per_model = Run.objects.filter(pk__in=run_ids).only("pk").delete()
        Workflow.objects.filter(pk__in=done).delete()
    return len(done), per_model.get(Run._meta.label, 0), events, ids[-1]
