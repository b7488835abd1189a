"""Why is it waiting? One run's answer, for every surface (API, CLI, admin).

``explain(run, now=...)`` reads what holds a run back and says it in data and in words::

    {"run": 17, "state": "blocked", "claimable": False,
     "waiting_for": [{"kind": "concurrency", "message": "limit billing (partition '42') is full: ...",
                      "limit": "billing", "partition": "42", "in_use": 1, "capacity": 1,
                      "holders": [12], "since": "2026-03-02T09:00:00Z"}],
     "next_possible_start": None}

``claimable``: pending or retrying, due, not in a paused queue, its task registered on a live worker
(when workers publish their tasks), and no capability its task
requires missing from every live worker (what a claim takes). ``waiting_for`` lists each reason
(a ``kind`` and a ``message``, plus the kind's fields; ``KINDS``); a finished run has none, a
leased or running one says so (``running``). ``next_possible_start`` is the earliest moment it
could start when that is knowable (its ``available_at``: a later slot, a retry's backoff, a
rate's next start; now, when it is claimable), else None: blocked until a holder ends, a paused
queue, a missing capability or worker.

Read-only, and few queries: none about limits unless the run's ``held_by`` names a declared
one. The rules themselves stay in ``services.limits``/``limit_rules`` (admission),
``queues`` and ``capabilities``; this module only reads them.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from ..clock import iso_utc
from ..errors import ValidationError
from ..models import (
    LEASED_STATES,
    TERMINAL_STATES,
    WAITING_STATES,
    EventType,
    Limit,
    QueuePause,
    Run,
    RunEvent,
    RunState,
)
from . import capabilities as capability_service
from . import limit_rules as rules
from . import limits, replacement, unknown_tasks, workflow_ops, workflows
from . import queues as queue_service

KINDS = (
    "running",  # leased or running: owner, lease_expires_at, lease_expired
    "cancel_requested",
    "queue_paused",  # queue, by, since, reason
    "capabilities",  # capabilities (the missing ones), queue
    "concurrency",  # limit, partition, in_use, capacity, holders, since
    "total",  # the same, over the whole limit
    "paused_limit",  # limit, partition, by, reason, until, since
    "replaces",  # replaces (the run id), replaces_state, since (overlap=replace)
    "blocked",  # blocked on something no longer declared or unknown: held_by, since
    "upstream",  # a workflow node: workflow, upstream (the nodes not ended: [{node, run, state}]), since
    "rate",  # limit, partition, rate, next_start
    "not_due",  # at, retry
    "no_worker",  # queue: claimable, but no live worker serves its queue
    "unknown_task",  # task, queue: no live worker serving its queue has its task registered
)
MAX_HOLDERS = 20  # holder ids listed per reason (in_use counts them all)


def _iso(moment: datetime | None) -> str | None:
    return iso_utc(moment) if moment is not None else None


def _runs_text(ids: list[int], total: int) -> str:
    if not ids:
        return "none"
    more = total - len(ids)
    text = ", ".join(str(i) for i in ids)
    return f"{text} and {more} more" if more > 0 else text


def explain(
    run: Run, *, now: datetime, pause_of: Callable[[str], QueuePause | None] = queue_service.pause_of
) -> dict[str, Any]:
    """Why ``run`` is not running at ``now`` (see the module's docstring for the shape). ``pause_of``
    reads a queue's pause (a page that shows the pause too passes one that remembers it)."""
    reasons: list[dict[str, Any]] = []
    claimable = False
    next_start: datetime | None = None
    if run.state in LEASED_STATES:
        reasons.append(_running(run, now))
        if run.cancel_requested:
            reasons.append(_cancel_requested(run))
    elif run.state not in TERMINAL_STATES:
        if run.cancel_requested:  # not kept by a waiting run today; said if a row carries it
            reasons.append(_cancel_requested(run))
        pause = pause_of(run.queue)
        if pause is not None:
            reasons.append(
                {
                    "kind": "queue_paused",
                    "message": f"queue {run.queue} is paused by {pause.paused_by} since {iso_utc(pause.paused_at)}"
                    + (f" ({pause.reason})" if pause.reason else "")
                    + ": its waiting runs are not claimed until it is resumed",
                    "queue": run.queue,
                    "by": pause.paused_by,
                    "since": iso_utc(pause.paused_at),
                    "reason": pause.reason,
                }
            )
        needs = capability_service.waiting_for_capabilities(run, now=now)
        if needs:
            reasons.append(
                {
                    "kind": "capabilities",
                    "message": f"no live worker serving queue {run.queue} has capabilities {', '.join(needs)}, "
                    f"which task {run.task_name} requires",
                    "capabilities": needs,
                    "queue": run.queue,
                }
            )
        # One query, for unknown_task and no_worker, of a waiting run (a blocked one says what blocks it).
        live = unknown_tasks.live_workers(now) if run.state in WAITING_STATES else []
        unknown = unknown_tasks.unknown_task(run.task_name, run.queue, live=live)
        if unknown:
            reasons.append(
                {
                    "kind": "unknown_task",
                    "message": f"no live worker serving queue {run.queue} has task {run.task_name} registered: "
                    "a worker that claims it gives it back without using an attempt; it runs once a worker "
                    "with the task's code starts",
                    "task": run.task_name,
                    "queue": run.queue,
                }
            )
        if run.state == RunState.BLOCKED:
            reasons += _blocked(run, now)
        elif run.state in WAITING_STATES:
            due = run.available_at <= now
            if not due:
                reasons.append(_throttled(run, now) or _not_due(run))
            claimable = due and pause is None and not needs and not unknown
            if claimable and not any(unknown_tasks.serves(queues, run.queue) for queues, _ in live):
                reasons.append(
                    {
                        "kind": "no_worker",
                        "message": f"no live worker serves queue {run.queue}: the first one to start claims it",
                        "queue": run.queue,
                    }
                )
            open_ended = pause is not None or bool(needs) or unknown or any(r["kind"] == "no_worker" for r in reasons)
            if not open_ended:
                next_start = max(run.available_at, now)
    return {
        "run": run.pk,
        "state": run.state,
        "claimable": claimable,
        "waiting_for": reasons,
        "next_possible_start": _iso(next_start),
    }


# -- leased, running ------------------------------------------------------------------------------


def _running(run: Run, now: datetime) -> dict[str, Any]:
    expires = run.lease_expires_at
    expired = expires is not None and expires <= now
    if run.state == RunState.LEASED:
        doing = f"leased by worker {run.lease_owner} (prefetched: it starts when one of its threads frees)"
    else:
        doing = f"running on worker {run.lease_owner}"
    if expired:
        tail = (
            f"; its lease expired at {_iso(expires)}: the next claim recovers it "
            "(another attempt, or dead when out of attempts)"
        )
    else:
        tail = f", lease until {_iso(expires)}" if expires is not None else ""
    return {
        "kind": "running",
        "message": doing + tail,
        "owner": run.lease_owner,
        "lease_expires_at": _iso(expires),
        "lease_expired": expired,
    }


def _cancel_requested(run: Run) -> dict[str, Any]:
    return {
        "kind": "cancel_requested",
        "message": "cancel requested: the task stops when it checks context.cancel_requested() "
        "(or ends on its own; a lost lease ends it too)",
    }


# -- waiting ---------------------------------------------------------------------------------------


def _not_due(run: Run) -> dict[str, Any]:
    at = iso_utc(run.available_at)
    retry = run.state == RunState.RETRYING
    if retry:
        message = f"retry backoff: attempt {run.attempts + 1} of {run.max_attempts} not before {at}"
    else:
        message = f"not due yet: scheduled for {at}"
    return {"kind": "not_due", "message": message, "at": at, "retry": retry}


def _throttled(run: Run, now: datetime) -> dict[str, Any] | None:
    """A waiting run whose ``available_at`` a limit's rate moved (its ``held_by`` names the limit)."""
    parsed = limits.parse_held_by(run.held_by) if run.held_by else None
    if parsed is None:
        return None
    name, key = parsed
    spec = _declared().get(name)
    if spec is None:
        return None
    numbers = spec.numbers_for(key, _override(name, now)[0])
    if numbers.rate is None:
        return None
    at = iso_utc(run.available_at)
    return {
        "kind": "rate",
        "message": f"rate {numbers.rate} of limit {name}{limits.partition_label(key)}: next start at {at}",
        "limit": name,
        "partition": key,
        "rate": str(numbers.rate),
        "next_start": at,
    }


# -- blocked ---------------------------------------------------------------------------------------


def _upstream(run: Run, workflow_id: int, since: str | None) -> dict[str, Any]:
    """A workflow node waiting for upstream nodes that have not ended."""
    waiting = workflow_ops.waiting_for(run)
    shown = waiting[:MAX_HOLDERS]
    names = ", ".join(f"{w['node']} (run {w['run']}, {w['state']})" for w in shown)
    more = f" and {len(waiting) - len(shown)} more" if len(waiting) > len(shown) else ""
    return {
        "kind": "upstream",
        "message": f"node of workflow {workflow_id}, waiting for "
        f"{names or 'nothing: the next sweep releases it'}{more}",
        "workflow": workflow_id,
        "upstream": shown,
        "since": since or _iso(run.created_at),
    }


def _since(run: Run) -> str | None:
    """When the run's current wait began: its latest ``blocked`` event."""
    qs = RunEvent.objects.filter(run_id=run.pk, event_type=EventType.BLOCKED).order_by("-id")
    return _iso(qs.values_list("created_at", flat=True).first())


def _blocked(run: Run, now: datetime) -> list[dict[str, Any]]:
    since = _since(run)
    if (holder := replacement.holder_id(run.held_by)) is not None:
        return [_replaces(holder, since, now)]
    if (workflow_id := workflows.waiting_workflow(run.held_by)) is not None:
        return [_upstream(run, workflow_id, since)]
    parsed = limits.parse_held_by(run.held_by)
    if parsed is None:
        return [
            {
                "kind": "blocked",
                "message": f"blocked ({run.held_by or 'no reason recorded'}): the next sweep re-examines it",
                "held_by": run.held_by,
                "since": since,
            }
        ]
    name, key = parsed
    spec = _declared().get(name)
    if spec is None:
        return [
            {
                "kind": "blocked",
                "message": f"blocked by limit {name}, which is no longer declared: the next sweep lets it through",
                "held_by": run.held_by,
                "since": since,
            }
        ]
    override, row = _override(name, now)
    numbers = spec.numbers_for(key, override)
    label = limits.partition_label(key)
    if numbers.paused:
        by = row.override_by if row is not None else ""
        why = row.override_reason if row is not None else ""
        until = row.override_until if row is not None else None
        return [
            {
                "kind": "paused_limit",
                "message": f"limit {name} is paused by {by or 'an operator'}"
                + (f" ({why})" if why else "")
                + (f" until {iso_utc(until)}" if until else " until it is reset"),
                "limit": name,
                "partition": key,
                "by": by,
                "reason": why,
                "until": _iso(until),
                "since": since,
            }
        ]
    out: list[dict[str, Any]] = []
    partition = limits.holders(name, key, now)
    cap = numbers.concurrency
    if cap is not None and len(partition) >= cap:
        out.append(_full("concurrency", f"limit {name}{label} is full", name, key, partition, cap, since))
    if numbers.total is not None:
        everywhere = limits.holders(name, None, now)
        if len(everywhere) >= numbers.total:
            text = f"limit {name} is full in all partitions"
            out.append(_full("total", text, name, key, everywhere, numbers.total, since))
        elif not out:
            out.append(_free("total", name, key, everywhere, numbers.total, since))
    if not out:
        out.append(_free("concurrency", name, key, partition, cap, since))
    return out


def _full(kind: str, text: str, name: str, key: str, ids: list[int], cap: int, since: str | None) -> dict[str, Any]:
    shown = ids[:MAX_HOLDERS]
    return {
        "kind": kind,
        "message": f"{text}: {len(ids)}/{cap} running (run(s) {_runs_text(shown, len(ids))}); "
        f"blocked since {since or 'unknown'}, until one of them ends",
        "limit": name,
        "partition": key,
        "in_use": len(ids),
        "capacity": cap,
        "holders": shown,
        "since": since,
    }


def _free(kind: str, name: str, key: str, ids: list[int], cap: int | None, since: str | None) -> dict[str, Any]:
    """Blocked, but a slot is free now (a holder's lease expired, or the limit was raised): the
    next release or sweep lets it through."""
    shown = ids[:MAX_HOLDERS]
    where = limits.partition_label(key) if kind == "concurrency" else " (all partitions)"
    used = f"{len(ids)}/{cap}" if cap is not None else str(len(ids))
    return {
        "kind": kind,
        "message": f"blocked by limit {name}{where} since {since or 'unknown'}; a slot is free now "
        f"({used} running): the next release or sweep lets it through",
        "limit": name,
        "partition": key,
        "in_use": len(ids),
        "capacity": cap,
        "holders": shown,
        "since": since,
    }


def _replaces(holder: int, since: str | None, now: datetime) -> dict[str, Any]:
    row = Run.objects.filter(pk=holder).only("id", "state", "lease_expires_at").first()
    state = row.state if row is not None else None
    if row is not None and replacement.executing(row, now):
        message = (
            f"waiting for run {holder} it replaces (overlap=replace), {state} and asked to stop: "
            f"starts once it has ended or its lease expired (lease until {_iso(row.lease_expires_at)})"
        )
    elif row is not None:
        message = f"run {holder} it replaces (overlap=replace) is {state}: the next sweep lets this run through"
    else:
        message = f"run {holder} it replaces (overlap=replace) no longer exists: the next sweep lets this run through"
    return {"kind": "replaces", "message": message, "replaces": holder, "replaces_state": state, "since": since}


# -- limits ----------------------------------------------------------------------------------------


def _declared() -> dict[str, rules.LimitSpec]:
    """The declared limits; none when ``DISTSCHED["LIMITS"]`` is malformed (the system check says
    so, distsched.E005): an explanation must not fail the page that shows it."""
    try:
        return rules.declared()
    except ValidationError:
        return {}


def _override(name: str, now: datetime) -> tuple[dict[str, Any] | None, Limit | None]:
    """The operator's override of the limit in force at ``now`` (as ``limits.active_overrides``
    reads it), and its row (who, why, until): one query."""
    row = Limit.objects.filter(name=name).first()
    if row is None or not row.override or (row.override_until is not None and row.override_until <= now):
        return None, None
    return row.override, row
