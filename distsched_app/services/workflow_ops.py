"""Reading and cancelling workflows (what the API, the CLI and the admin call)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.db.models import Count, QuerySet

from ..db import locks
from ..errors import InvalidStateTransition, NotFound, ValidationError
from ..models import (
    ACTIVE_STATES,
    AuditAction,
    AuditSource,
    AuditTarget,
    EventType,
    Run,
    RunState,
    Workflow,
    WorkflowEdge,
    WorkflowNode,
    WorkflowState,
)
from . import audit, events, workflow_release
from .runs import CANCELLABLE_AT_ONCE, WAITING_LAST, cancel_locked
from .validation import check_storable


class WorkflowNotFound(NotFound):
    """No workflow with that id."""


def get_workflow(workflow_id: object) -> Workflow:
    try:
        return Workflow.objects.get(pk=int(str(workflow_id)))
    except (Workflow.DoesNotExist, ValueError, TypeError, OverflowError):
        raise WorkflowNotFound(f"no workflow with id {workflow_id!r}") from None


def list_workflows(*, state: str | None = None, name: str | None = None) -> QuerySet[Workflow]:
    """Newest first, filtered by state and exact name."""
    qs = Workflow.objects.all()
    if state is not None:
        if state not in WorkflowState.values:
            raise ValidationError(f"state must be one of {', '.join(WorkflowState.values)}", field="state")
        qs = qs.filter(state=state)
    if name is not None:
        check_storable(name, field="name")  # NUL: no database can compare it
        qs = qs.filter(name=name)
    return qs.order_by("-id")


def workflows_by_state() -> dict[str, int]:
    """Every workflow state with its count (0 when none): one grouped read of the state index."""
    counts = dict(Workflow.objects.order_by().values_list("state").annotate(n=Count("id")))
    return {state: counts.get(state, 0) for state in WorkflowState.values}


@dataclass(frozen=True, kw_only=True)
class NodeView:
    """One node as screens show it."""

    id: str
    run: int
    state: str
    task: str
    after: tuple[str, ...]
    on_upstream_failure: str
    ended_by: int | None


def nodes(workflow: Workflow) -> list[NodeView]:
    """Every node with its run's state and its upstream node ids (two queries)."""
    rows = list(
        WorkflowNode.objects.filter(workflow_id=workflow.pk)
        .order_by("run_id")
        .values_list("run_id", "node", "run__state", "run__task_name", "on_upstream_failure", "ended_by")
    )
    name = {run_id: node for run_id, node, *_ in rows}
    after: dict[int, list[str]] = {}
    edges = WorkflowEdge.objects.filter(downstream_id__in=list(name)).order_by("upstream_id")
    for up, down in edges.values_list("upstream_id", "downstream_id"):
        after.setdefault(down, []).append(name.get(up, str(up)))
    return [
        NodeView(
            id=node, run=run_id, state=state, task=task, after=tuple(after.get(run_id, ())),
            on_upstream_failure=rule, ended_by=ended_by,
        )
        for run_id, node, state, task, rule, ended_by in rows
    ]  # fmt: skip


def upstream_results(run: Run) -> dict[str, object]:
    """``{node id: result}`` of the run's upstream nodes (one query); {} outside a workflow."""
    if run.workflow_id is None:
        return {}
    rows = WorkflowEdge.objects.filter(downstream_id=run.pk).values_list(
        "upstream__workflow_node__node", "upstream__result"
    )
    return dict(rows)


def waiting_for(run: Run) -> list[dict[str, object]]:
    """The upstream nodes a waiting node still waits for: ``[{node, run, state}]`` (the index of
    edges not done: its finished upstreams are not read)."""
    rows = (
        WorkflowEdge.objects.filter(downstream_id=run.pk, done=False)
        .order_by("upstream_id")
        .values_list("upstream__workflow_node__node", "upstream_id", "upstream__state")
    )
    return [{"node": node, "run": up, "state": state} for node, up, state in rows]


def cancel_workflow(
    workflow_id: object, *, now: datetime, actor: str = audit.CODE, source: str = AuditSource.CODE, reason: str = ""
) -> Workflow:
    """Cancel every unfinished node: waiting ones at once, running ones by a cancel request their
    task sees (as a run's cancel). The workflow is ``cancelled``; it finishes when its last node
    has ended. A finished workflow is refused (``InvalidStateTransition``)."""
    who = audit.who(actor, source, reason)
    by = f"by {who[0]}: {who[2]}" if who[2] else f"by {who[0]}"
    with transaction.atomic():
        workflow = get_workflow(workflow_id)
        # Running nodes before waiting ones (``runs.WAITING_LAST``), as a finishing worker locks them.
        active = Run.objects.filter(workflow_id=workflow.pk, state__in=ACTIVE_STATES).order_by(WAITING_LAST, "id")
        runs = list(locks.row_locked(active, of=("self",)))
        workflow = locks.row_locked(Workflow.objects.filter(pk=workflow.pk)).get()
        if workflow.finished_at is not None or workflow.state == WorkflowState.CANCELLED:
            raise InvalidStateTransition(
                f"workflow {workflow.pk} is {workflow.state}; only a running one can be cancelled"
            )
        workflow.state = WorkflowState.CANCELLED
        workflow.save(update_fields=["state"])
        waiting = [r.pk for r in runs if r.state in CANCELLABLE_AT_ONCE]
        Run.objects.filter(pk__in=waiting).update(state=RunState.CANCELLED, finished_at=now, held_by="", updated_at=now)
        message = f"cancelled with workflow {workflow.pk} {by}"
        events.record_many(
            events.NewEvent(run_id=r, event_type=EventType.CANCELLED, now=now, message=message) for r in waiting
        )
        for run in runs:
            if run.state not in CANCELLABLE_AT_ONCE:
                cancel_locked(run, now=now, reason=f"with workflow {workflow.pk} {by}")
        # Their downstream nodes were cancelled with them; "run" nodes too: the edges are marked.
        workflow_release.ended(dict.fromkeys(waiting, RunState.CANCELLED.value), now=now, workflow_ids=[workflow.pk])
        audit.record(
            kind=AuditTarget.WORKFLOW, target=str(workflow.pk), action=AuditAction.CANCEL, now=now, who=who,
            data={"name": workflow.name, "cancelled": len(waiting)},
        )  # fmt: skip
        workflow.refresh_from_db()
    return workflow
