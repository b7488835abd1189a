"""Workflow transitions: what happens to a node's downstream when it ends, or is requeued.

Called by the outcome paths in the transaction that wrote the run's terminal state, and only
for runs of a workflow (``Run.workflow_id`` is checked in Python first: other runs pay nothing).

Only the finishing runs' own downstream nodes are looked at. Their edges are marked ``done``,
then the downstream runs still waiting are locked (``FOR UPDATE``, in id order) *before* their
remaining upstreams are read: when two upstreams of a join finish at once on two workers, the
second waits for the first's COMMIT and then sees it (PostgreSQL re-reads per statement under
READ COMMITTED; SQLite serialises writers), so the join is released exactly once, never never.
"Does the node still wait?" reads the partial index of edges not done: no scan of siblings.

Rules: behind a dead, cancelled or skipped upstream a node with ``on_upstream_failure="cancel"``
ends ``skipped`` at once (an event names the upstream; ``WorkflowNode.ended_by`` keeps it), and
so on down the graph; a node with ``"run"`` waits until every upstream has ended, then runs.
Requeueing an upstream re-opens the nodes that ended because of it. The workflow's state and
finish time are set when its last node ends (its row locked first, for the same race).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from django.db import transaction
from django.db.models import Exists, OuterRef

from ..db import locks, notify
from ..db import workflows as db_workflows
from ..errors import InvalidStateTransition
from ..models import (
    ACTIVE_STATES,
    TERMINAL_STATES,
    EventType,
    Run,
    RunState,
    UpstreamFailure,
    Workflow,
    WorkflowEdge,
    WorkflowNode,
    WorkflowState,
)
from ..workflow_models import WAITING_PREFIX
from . import events

# How often a worker runs the sweep: a safety net, so rarely (it reads the edges still waiting).
SWEEP_SECONDS = 30.0

# An upstream in one of these states keeps a "cancel" node from running.
FAILED_STATES = (RunState.DEAD, RunState.CANCELLED, RunState.SKIPPED)


def _label(workflow_id: int) -> str:
    return f"{WAITING_PREFIX}{workflow_id}"


def _names(run_ids: Iterable[int]) -> dict[int, str]:
    ids = sorted(set(run_ids))
    return dict(WorkflowNode.objects.filter(run_id__in=ids).values_list("run_id", "node")) if ids else {}


def ended(finished: Mapping[int, str], *, now: datetime, workflow_ids: Iterable[int] | None = None) -> None:
    """Runs of workflows ended (run id -> terminal state, written in this transaction): release,
    or end, their downstream nodes, transitively, and close workflows whose last node ended.
    ``workflow_ids``: their workflows, when the caller knows them (else read)."""
    if not finished:
        return
    if workflow_ids is None:
        workflow_ids = Run.objects.filter(pk__in=sorted(finished)).values_list("workflow_id", flat=True)
    touched = {w for w in workflow_ids if w is not None}
    live: set[int] = set()  # workflows with a node this transaction holds unfinished
    current = dict(finished)
    while current:
        current = _downstream_of(current, now=now, touched=touched, live=live)
    close(touched - live, now=now)


def _downstream_of(finished: Mapping[int, str], *, now: datetime, touched: set[int], live: set[int]) -> dict[int, str]:
    """One step down the graph; returns the nodes this step ended (skipped), for the next."""
    # Waiting downstream nodes locked before their other upstreams are read (PostgreSQL): the one
    # rule that makes concurrent finishes safe. SQLite's writers are serialised: one statement.
    edges, locked = db_workflows.end_edges(sorted(finished))
    if not locked:
        return {}
    failed_by: dict[int, int] = {}
    for up, down in edges:
        if finished[up] in FAILED_STATES:
            failed_by.setdefault(down, up)
    skip: dict[int, int] = {}
    release: list[int] = []
    strict: list[int] = []
    for run_id, workflow_id, rule, waits in locked:
        touched.add(workflow_id)
        if rule != UpstreamFailure.RUN and run_id in failed_by:
            skip[run_id] = failed_by[run_id]
            continue
        # Waiting or released, this node is unfinished, and locked by us until COMMIT: its workflow
        # cannot end in this transaction, and its own end will close it (no close check needed).
        live.add(workflow_id)
        if not waits:
            release.append(run_id)
            if rule != UpstreamFailure.RUN:
                strict.append(run_id)
    # A "cancel" node whose upstreams have all ended may still sit behind an earlier failure
    # (one that ended while it was re-opened): read once, when it is about to run.
    behind = _failed_upstreams(strict)
    skip.update(behind)
    if behind:  # those are not live after all: their workflows are checked for the close
        live.difference_update(w for r, w, _, _ in locked if r in behind)
    _release([r for r in release if r not in behind], now=now)
    _skip(skip, now=now)
    return dict.fromkeys(skip, RunState.SKIPPED.value)


def _failed_upstreams(run_ids: list[int]) -> dict[int, int]:
    """Of these nodes, those with an upstream that failed: node -> one such upstream."""
    if not run_ids:
        return {}
    rows = WorkflowEdge.objects.filter(downstream_id__in=run_ids, upstream__state__in=FAILED_STATES)
    out: dict[int, int] = {}
    for down, up in rows.order_by("upstream_id").values_list("downstream_id", "upstream_id"):
        out.setdefault(down, up)
    return out


def _release(run_ids: list[int], *, now: datetime) -> None:
    if not run_ids:
        return
    Run.objects.filter(pk__in=run_ids, state=RunState.BLOCKED).update(
        state=RunState.PENDING, held_by="", available_at=now, updated_at=now
    )
    notify.notify(Run.objects.filter(pk__in=run_ids).values_list("queue", flat=True))
    events.record_many(
        events.NewEvent(run_id=r, event_type=EventType.UNBLOCKED, now=now, message="every upstream node ended: ready")
        for r in run_ids
    )


def _skip(skip: Mapping[int, int], *, now: datetime) -> None:
    """End these waiting nodes skipped, each naming the upstream (run id) that failed."""
    if not skip:
        return
    Run.objects.filter(pk__in=sorted(skip), state=RunState.BLOCKED).update(
        state=RunState.SKIPPED, held_by="", finished_at=now, updated_at=now
    )
    by_upstream: dict[int, list[int]] = {}
    for down, up in skip.items():
        by_upstream.setdefault(up, []).append(down)
    for up, downs in by_upstream.items():
        WorkflowNode.objects.filter(run_id__in=downs).update(ended_by=up)
    names = _names(skip.values())
    states = dict(Run.objects.filter(pk__in=sorted(set(skip.values()))).values_list("id", "state"))
    events.record_many(
        events.NewEvent(
            run_id=down, event_type=EventType.SKIPPED, now=now,
            message=f"not run: upstream node {names.get(up, '?')!r} (run {up}) ended {states.get(up, '?')}",
        )
        for down, up in sorted(skip.items())
    )  # fmt: skip


def close(workflow_ids: Iterable[int], *, now: datetime) -> list[int]:
    """Set the state and finish time of those workflows whose every node has ended. Each row is
    locked before its nodes are read (two last nodes ending at once close it once). Returns the
    ids closed."""
    closed = []
    for workflow_id in sorted(set(workflow_ids)):
        row = locks.row_locked(Workflow.objects.filter(pk=workflow_id, finished_at__isnull=True)).first()
        if row is None or Run.objects.filter(workflow_id=workflow_id, state__in=ACTIVE_STATES).exists():
            continue
        if row.state != WorkflowState.CANCELLED:
            failed = WorkflowNode.objects.filter(workflow_id=workflow_id).exclude(run__state=RunState.SUCCEEDED)
            row.state = WorkflowState.FAILED if failed.exists() else WorkflowState.SUCCEEDED
        row.finished_at = now
        row.save(update_fields=["state", "finished_at"])
        closed.append(workflow_id)
    return closed


def requeued(run: Run, *, now: datetime) -> None:
    """``run`` (a workflow's node) was just put back to pending by a requeue, in this transaction:
    it waits again if an upstream has not ended (and is refused behind a failed one, unless it is a
    "run" node), and the nodes that ended because of it are re-opened, transitively."""
    node = WorkflowNode.objects.filter(run_id=run.pk).values_list("node", "on_upstream_failure").first()
    if node is None:
        return
    ups = list(
        WorkflowEdge.objects.filter(downstream_id=run.pk).values_list(
            "upstream_id", "upstream__state", "upstream__workflow_node__node"
        )
    )
    if node[1] != UpstreamFailure.RUN:
        for up, state, name in ups:
            if state in FAILED_STATES:
                raise InvalidStateTransition(
                    f"run {run.pk} is node {node[0]!r} of workflow {run.workflow_id}, behind node {name!r} "
                    f"(run {up}), which is {state}: requeue that run instead"
                )
    if any(state not in TERMINAL_STATES for _, state, _ in ups):
        Run.objects.filter(pk=run.pk).update(state=RunState.BLOCKED, held_by=_label(run.workflow_id or 0))
        run.state, run.held_by = RunState.BLOCKED, _label(run.workflow_id or 0)
    WorkflowNode.objects.filter(run_id=run.pk).update(ended_by=None)
    _reopen([run.pk], now=now)
    Workflow.objects.filter(pk=run.workflow_id or 0, finished_at__isnull=False).update(
        state=WorkflowState.RUNNING, finished_at=None
    )


def _reopen(run_ids: list[int], *, now: datetime) -> None:
    """These runs are unfinished again: their edges wait again, and the nodes they ended wait too."""
    while run_ids:
        WorkflowEdge.objects.filter(upstream_id__in=run_ids).update(done=False)
        ended_here = Run.objects.filter(workflow_node__ended_by__in=run_ids, state=RunState.SKIPPED).order_by("id")
        rows: list[tuple[int, int, int]] = list(
            locks.row_locked(ended_here, of=("self",)).values_list("id", "workflow_id", "workflow_node__ended_by")
        )
        if not rows:
            return
        names = _names(up for _, _, up in rows)
        for run_id, workflow_id, _ in rows:
            Run.objects.filter(pk=run_id, state=RunState.SKIPPED).update(
                state=RunState.BLOCKED, held_by=_label(workflow_id), finished_at=None, updated_at=now
            )
        WorkflowNode.objects.filter(run_id__in=[r for r, _, _ in rows]).update(ended_by=None)
        events.record_many(
            events.NewEvent(
                run_id=run_id, event_type=EventType.BLOCKED, now=now,
                message=f"re-opened: upstream node {names.get(up, '?')!r} (run {up}) was requeued",
            )
            for run_id, _, up in rows
        )  # fmt: skip
        run_ids = [r for r, _, _ in rows]


def sweep(now: datetime, *, limit: int = 500) -> int:
    """The safety net: evaluate waiting nodes that no edge holds any more (a missed transition),
    and close workflows with no unfinished node. Returns how many nodes it moved."""
    open_ids = list(Workflow.objects.filter(finished_at__isnull=True).values_list("id", flat=True)[:limit])
    if not open_ids:
        return 0  # the common case: no workflow in flight, one indexed query
    # Edges whose upstream ended without the edge being marked, and waiting nodes no edge holds.
    ups = dict(
        WorkflowEdge.objects.filter(done=False, upstream__state__in=TERMINAL_STATES)
        .order_by()
        .values_list("upstream_id", "upstream__state")[:limit]
    )
    undone = WorkflowEdge.objects.filter(downstream_id=OuterRef("pk"), done=False)
    stuck = Run.objects.filter(state=RunState.BLOCKED, held_by__startswith=WAITING_PREFIX).filter(~Exists(undone))
    stuck_ids = list(stuck.order_by("id").values_list("id", flat=True)[:limit])
    if stuck_ids:
        for up, state in WorkflowEdge.objects.filter(downstream_id__in=stuck_ids).values_list(
            "upstream_id", "upstream__state"
        ):
            if state in TERMINAL_STATES:
                ups[up] = state
    moved = 0
    with transaction.atomic():
        if ups:
            # Through the normal path, as if those upstreams had just ended.
            waiting = Run.objects.filter(state=RunState.BLOCKED, held_by__startswith=WAITING_PREFIX)
            before = waiting.count()
            ended(ups, now=now)
            moved = before - waiting.count()
        idle = [w for w in open_ids if not Run.objects.filter(workflow_id=w, state__in=ACTIVE_STATES).exists()]
        close(idle, now=now)
    return moved
