"""Workflows: a static graph of runs, validated whole and written in one transaction.

``enqueue(spec)`` checks everything first (names, unique node ids, known ``after`` ids, no
cycle, registered tasks, storable payloads, queues, retry options), so an invalid spec writes
nothing. Then the workflow row, every node's run, its ``created`` event, the node rows and the
edges go in with the bulk helpers (``db.bulk``): a handful of statements whatever the size.
Nodes without upstreams start ``pending``; the others are ``blocked`` on the workflow
(``held_by = "workflow:<id>"``) until ``services.workflow_release`` lets them through.
Runs are written in topological order, so a node's run id is above its upstreams'.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from django.db import transaction

from ..conf import conf
from ..db import bulk, notify
from ..db.workflows import reserve_run_ids
from ..errors import ValidationError
from ..models import (
    EventType,
    Origin,
    Run,
    RunEvent,
    RunState,
    UpstreamFailure,
    Workflow,
    WorkflowEdge,
    WorkflowNode,
    WorkflowState,
)
from ..text import storable
from ..workflow_models import WAITING_PREFIX
from . import audit, limit_rules
from .enqueue import Job, _validated, declared, validate_policy
from .validation import check_storable, validate_task_name, validate_task_queue, validated_json

MAX_NODES = 100_000
NODE_ID_MAX = 100
NAME_MAX = 200
NODE_FIELDS = frozenset(
    {"id", "task", "args", "kwargs", "after", "on_upstream_failure", "queue", "priority", "max_attempts",
     "retry_base_seconds", "retry_max_seconds", "retry_jitter"}
)  # fmt: skip
_RETRY_FIELDS = ("max_attempts", "retry_base_seconds", "retry_max_seconds", "retry_jitter")
_RULES = frozenset(UpstreamFailure.values)


def waiting_label(workflow_id: int) -> str:
    """``Run.held_by`` of a node waiting for its upstream nodes."""
    return f"{WAITING_PREFIX}{workflow_id}"


def waiting_workflow(held_by: str) -> int | None:
    """The workflow id a ``held_by`` of this module names, else None (a limit's, a run's)."""
    if not held_by.startswith(WAITING_PREFIX):
        return None
    text = held_by[len(WAITING_PREFIX) :]
    return int(text) if text.isdigit() else None


@dataclass(frozen=True, kw_only=True)
class Node:
    """One validated node, ready to be written."""

    id: str
    after: tuple[str, ...]
    on_upstream_failure: str
    run: Any  # db.runs.NewRun


@dataclass(frozen=True, kw_only=True)
class Enqueued:
    """What ``enqueue`` wrote: the workflow's id and ``{node id: run id}``."""

    id: int
    name: str
    runs: dict[str, int]


def _error(message: str, *, index: int | None = None, key: str = "") -> ValidationError:
    where = "nodes" if index is None else f"nodes.{index}" + (f".{key}" if key else "")
    return ValidationError(message, field=where)


def _validated_run(raw: Mapping[str, Any], *, now: datetime, shared: dict[Any, Any]) -> Any:
    """The node's run (``db.runs.NewRun``), validated as an enqueued run is. What nodes share (task,
    queue, priority, retry options: its declaration, the queue checks, the policy) is validated
    once per distinct combination; each node's payload on its own."""
    key: Any = (raw.get("task"), raw.get("queue"), raw.get("priority"), *(raw.get(k) for k in _RETRY_FIELDS))
    try:
        base = shared.get(key)
    except TypeError:  # an unhashable option (a list where a number goes): validated the long way
        base, key = None, None
    if base is not None:
        args, args_json = validated_json(raw.get("args") or [], field="args")
        kwargs, kwargs_json = validated_json(raw.get("kwargs") or {}, field="kwargs")
        if conf.LIMITS:  # a run under a limit with missing="error" must carry its partition key
            limit_rules.keys_for(base.task_name, base.queue, args, kwargs)
        return replace(base, args=args, kwargs=kwargs, args_json=args_json, kwargs_json=kwargs_json)
    task_name = validate_task_name(raw.get("task"))
    d = declared(task_name)
    queue = validate_task_queue(task_name, raw["queue"] if raw.get("queue") is not None else d.queue)
    policy = validate_policy({k: raw[k] for k in _RETRY_FIELDS if raw.get(k) is not None}, base=d.policy)
    job = Job(
        task_name=task_name, args=raw.get("args") or [], kwargs=raw.get("kwargs") or {}, queue=queue,
        priority=d.priority if raw.get("priority") is None else raw["priority"],
    )  # fmt: skip
    new = _validated(job, policy=policy, now=now)
    if key is not None:
        shared[key] = new
    return new


def _node(raw: Any, index: int, *, now: datetime, shared: dict[Any, Any]) -> Node:
    if not isinstance(raw, Mapping):
        raise _error("a node must be an object", index=index)
    unknown = set(raw) - NODE_FIELDS
    if unknown:
        raise _error(f"unknown node field(s): {', '.join(sorted(map(str, unknown)))}", index=index)
    node_id = raw.get("id")
    if not isinstance(node_id, str) or not node_id.strip() or len(node_id) > NODE_ID_MAX:
        raise _error(f"id must be a non-blank string of at most {NODE_ID_MAX} characters", index=index, key="id")
    check_storable(node_id, field=f"nodes.{index}.id")
    try:
        new = _validated_run(raw, now=now, shared=shared)
    except ValidationError as exc:
        key = "task" if exc.field == "task_name" else (exc.field or "")
        raise _error(f"node {node_id!r}: {exc.message}", index=index, key=key) from None
    after = raw.get("after") or []
    if not isinstance(after, list | tuple) or not all(isinstance(a, str) for a in after):
        raise _error("after must be a list of node ids", index=index, key="after")
    if len(set(after)) != len(after):
        raise _error(f"node {node_id!r}: after names a node twice", index=index, key="after")
    rule = raw.get("on_upstream_failure") or UpstreamFailure.CANCEL.value
    if rule not in _RULES:
        raise _error(
            f"on_upstream_failure must be one of {', '.join(UpstreamFailure.values)}", index=index,
            key="on_upstream_failure",
        )  # fmt: skip
    return Node(id=node_id, after=tuple(after), on_upstream_failure=rule, run=new)


def _ordered(nodes: list[Node]) -> list[Node]:
    """The nodes in topological order (upstreams first, else the spec's order); a cycle is an error."""
    index = {n.id: i for i, n in enumerate(nodes)}
    downstream: dict[str, list[str]] = {n.id: [] for n in nodes}
    missing = {n.id: len(n.after) for n in nodes}
    for i, n in enumerate(nodes):
        for up in n.after:
            if up not in index:
                raise _error(f"node {n.id!r}: after names unknown node {up!r}", index=i, key="after")
            if up == n.id:
                raise _error(f"node {n.id!r} waits for itself", index=i, key="after")
            downstream[up].append(n.id)
    ready = deque(n.id for n in nodes if not n.after)
    out: list[Node] = []
    while ready:
        current = ready.popleft()
        out.append(nodes[index[current]])
        for down in downstream[current]:
            missing[down] -= 1
            if not missing[down]:
                ready.append(down)
    if len(out) != len(nodes):
        cycle = sorted(node_id for node_id, left in missing.items() if left)
        raise ValidationError(f"the nodes form a cycle: {', '.join(map(repr, cycle[:10]))}", field="nodes")
    return out


def validate(spec: Any, *, now: datetime) -> tuple[str, list[Node]]:
    """The spec's name and its nodes in topological order, or a ``ValidationError``."""
    if not isinstance(spec, Mapping):
        raise ValidationError("a workflow spec must be an object with a name and nodes", field="non_field_errors")
    unknown = set(spec) - {"name", "nodes"}
    if unknown:
        raise ValidationError(f"unknown field(s): {', '.join(sorted(map(str, unknown)))}", field="non_field_errors")
    name = spec.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > NAME_MAX:
        raise ValidationError(f"name must be a non-blank string of at most {NAME_MAX} characters", field="name")
    check_storable(name, field="name")
    raw_nodes = spec.get("nodes")
    if not isinstance(raw_nodes, list | tuple) or not raw_nodes:
        raise ValidationError("a workflow needs at least one node", field="nodes")
    if len(raw_nodes) > MAX_NODES:
        raise ValidationError(f"a workflow has at most {MAX_NODES} nodes", field="nodes")
    shared: dict[Any, Any] = {}
    nodes = [_node(raw, i, now=now, shared=shared) for i, raw in enumerate(raw_nodes)]
    seen: set[str] = set()
    for i, n in enumerate(nodes):
        if n.id in seen:
            raise _error(f"node id {n.id!r} is used twice", index=i, key="id")
        seen.add(n.id)
    return name, _ordered(nodes)


def enqueue(spec: Any, *, now: datetime, actor: str = audit.CODE) -> Enqueued:
    """Validate ``spec`` whole, then write the workflow in one transaction (the caller's, if any)."""
    name, nodes = validate(spec, now=now)
    with transaction.atomic():
        workflow = Workflow.objects.create(
            name=name, state=WorkflowState.RUNNING, created_at=now, created_by=storable(actor, 200)
        )
        ids = reserve_run_ids(len(nodes))
        run_of = {n.id: run_id for n, run_id in zip(nodes, ids, strict=True)}
        _write(workflow, nodes, run_of, now=now)
    return Enqueued(id=workflow.pk, name=name, runs={n.id: run_of[n.id] for n in nodes})


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


def _write(workflow: Workflow, nodes: list[Node], run_of: dict[str, int], *, now: datetime) -> None:
    n = len(nodes)
    ids = [run_of[node.id] for node in nodes]
    label = waiting_label(workflow.pk)
    states = [RunState.BLOCKED.value if node.after else RunState.PENDING.value for node in nodes]
    runs = [node.run for node in nodes]
    bulk.insert_rows(
        Run,
        {
            "id": ids,
            "task_name": [r.task_name for r in runs],
            "args": [r.args_json for r in runs],
            "kwargs": [r.kwargs_json for r in runs],
            "state": states,
            "scheduled_for": [now] * n,
            "available_at": [now] * n,
            "attempts": [0] * n,
            "max_attempts": [r.max_attempts for r in runs],
            "lease_owner": [""] * n,
            "last_error": [""] * n,
            "queue": [r.queue for r in runs],
            "origin": [Origin.ENQUEUED.value] * n,
            "idempotency_key": [f"{Origin.ENQUEUED.value}:{i}" for i in ids],
            "cancel_requested": [False] * n,
            "created_at": [now] * n,
            "updated_at": [now] * n,
            "priority": [r.priority for r in runs],
            "retry_policy": [_json(r.retry_policy) for r in runs],
            "held_by": [label if node.after else "" for node in nodes],
            "workflow": [workflow.pk] * n,
        },
    )
    message = f"node of workflow {workflow.pk} ({storable(workflow.name, 200)})"
    bulk.insert_rows(
        RunEvent,
        {
            "run": ids,
            "event_type": [EventType.CREATED.value] * n,
            "message": [f"{message}; waits for {', '.join(node.after)}" if node.after else message for node in nodes],
            "worker_id": [""] * n,
            "attempt": [0] * n,
            "created_at": [now] * n,
        },
    )
    bulk.insert_rows(
        WorkflowNode,
        {
            "run": ids,
            "workflow": [workflow.pk] * n,
            "node": [node.id for node in nodes],
            "on_upstream_failure": [node.on_upstream_failure for node in nodes],
        },
    )
    edges = [(run_of[up], run_of[node.id]) for node in nodes for up in node.after]
    if edges:
        bulk.insert_rows(
            WorkflowEdge,
            {"upstream": [e[0] for e in edges], "downstream": [e[1] for e in edges], "done": [False] * len(edges)},
        )
    notify.notify({r.queue for r, state in zip(runs, states, strict=True) if state == RunState.PENDING})
