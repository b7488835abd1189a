"""The ``limit`` verbs of ``manage.py distsched``: list, show, set, reset.

Like every verb (``verbs``), each reads its options and ``now``, calls
``services.limit_overrides`` and returns ``(the --json document, the text for humans)``.
The actor recorded is ``cli:<os user>``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from ...models import LimitEvent
from ...services import limit_overrides, queues
from ...services.limit_overrides import LimitStatus
from .records import iso
from .tables import key_values, table, when

Output = tuple[Any, str]

# --option -> the override's number
SET_OPTIONS = ("concurrency", "total", "rate", "burst", "local")
HISTORY = 50  # overrides shown by `limit show`, newest first


def status_record(status: LimitStatus) -> dict[str, Any]:
    return status.as_record(iso)


def event_record(event: LimitEvent) -> dict[str, Any]:
    return {
        "id": event.pk,
        "limit": event.limit,
        "action": event.action,
        "actor": event.actor,
        "reason": event.reason,
        "override": event.override,
        "until": iso(event.until),
        "created_at": iso(event.created_at),
    }


def numbers_text(numbers: dict[str, Any] | None) -> str:
    """``concurrency 3, rate 5/s (burst 2), paused``: the numbers set, in a line."""
    if not numbers:
        return "-"
    parts = [f"{name} {numbers[name]}" for name in ("concurrency", "total", "rate") if numbers.get(name) is not None]
    if numbers.get("rate") is not None and (numbers.get("burst") or 1) > 1:
        parts[-1] += f" (burst {numbers['burst']})"
    if numbers.get("local") is not None:
        parts.append(f"local {numbers['local']}")
    if numbers.get("paused"):
        parts.append("paused")
    dropped = [name for name, value in numbers.items() if value is None]
    parts += [f"no {name}" for name in dropped]
    return ", ".join(parts) or "-"


def _given(numbers: dict[str, Any]) -> dict[str, Any]:
    """The numbers that limit something (a status lists every number, None where unset)."""
    return {k: v for k, v in numbers.items() if v is not None and v is not False}


def _applies_to(status: LimitStatus) -> str:
    return ", ".join([*(f"task {t}" for t in status.tasks), *(f"queue {q}" for q in status.queues)])


def _override_text(status: LimitStatus) -> str | None:
    if status.override is None:
        return None
    until = f" until {when(status.override_until)}" if status.override_until else " until reset"
    why = f": {status.override_reason!r}" if status.override_reason else ""
    return f"{numbers_text(status.override)} by {status.override_by}{until}{why}"


def limit_list(now: datetime, o: dict[str, Any]) -> Output:
    found = limit_overrides.status(now)
    rows = [
        (
            s.name,
            _applies_to(s),
            numbers_text(_given(s.effective)),
            s.in_use,
            s.blocked,
            s.throttled,
            s.saturated_partitions,
            "yes" if s.override is not None else "no",
        )
        for s in found
    ]
    headers = ("LIMIT", "APPLIES TO", "EFFECTIVE", "IN USE", "BLOCKED", "THROTTLED", "SATURATED", "OVERRIDDEN")
    text = table(headers, rows) if found else "no limits declared (DISTSCHED['LIMITS'])"
    return [status_record(s) for s in found], text


def limit_show(now: datetime, o: dict[str, Any]) -> Output:
    [status] = limit_overrides.status(now, name=o["name"])
    history = limit_overrides.limit_events(o["name"], limit=HISTORY)
    lines = key_values(
        [
            ("limit", status.name),
            ("applies to", _applies_to(status)),
            ("partition_by", ", ".join(status.partition_by) or None),
            ("fair", status.fair),
            ("declared", numbers_text(_given(status.declared))),
            ("override", _override_text(status)),
            ("effective", numbers_text(_given(status.effective))),
            ("in use", status.in_use),
            ("blocked", status.blocked),
            ("throttled", status.throttled),
            ("saturated", f"{status.saturated_partitions} partition(s)"),
        ]
    )
    if status.top_partitions:
        partitions = [(p["partition"] or '""', p["blocked"], p["in_use"]) for p in status.top_partitions]
        lines += "\n\n" + table(("PARTITION", "BLOCKED", "IN USE"), partitions)
    if history:
        events = [(e.created_at, e.action, e.actor, numbers_text(e.override), e.until, e.reason) for e in history]
        lines += "\n\n" + table(("AT", "ACTION", "BY", "OVERRIDE", "UNTIL", "REASON"), events, max_width=100)
    else:
        lines += "\n\nno overrides yet"
    document = {**status_record(status), "history": [event_record(e) for e in history]}
    return document, lines


def limit_set(now: datetime, o: dict[str, Any]) -> Output:
    values: dict[str, Any] = {name: o[name] for name in SET_OPTIONS if o[name] is not None}
    if o["pause"]:
        values["paused"] = True
    duration = o["for_seconds"]
    change = limit_overrides.set_override(
        o["name"],
        values,
        now=now,
        by=queues.cli_actor(),
        reason=o["reason"] or "",
        for_seconds=duration.total_seconds() if duration is not None else None,
    )
    [status] = limit_overrides.status(now, name=change.limit)
    until = f"until {when(change.until)}" if change.until else "until reset"
    released = f"; {change.released} blocked run(s) let through" if change.released else ""
    text = f"limit {change.limit}: {numbers_text(change.override)} {until}{released}"
    return {**status_record(status), "released": change.released}, text


def limit_reset(now: datetime, o: dict[str, Any]) -> Output:
    [before] = limit_overrides.status(now, name=o["name"])
    change = limit_overrides.reset_override(o["name"], now=now, by=queues.cli_actor(), reason=o["reason"] or "")
    [status] = limit_overrides.status(now, name=change.limit)
    if before.override is None:
        text = f"limit {change.limit} has no override: nothing changed"
    else:
        released = f"; {change.released} blocked run(s) let through" if change.released else ""
        text = (
            f"limit {change.limit} is back to its declared numbers ({numbers_text(_given(status.effective))}){released}"
        )
    return {**status_record(status), "released": change.released}, text


VERBS: dict[str, Callable[[datetime, dict[str, Any]], Output]] = {
    "limit list": limit_list,
    "limit show": limit_show,
    "limit set": limit_set,
    "limit reset": limit_reset,
}
