"""The audit trail: who changed a schedule (each change a version), and the other operator actions.

The services that change things call ``record`` inside their own transaction, so an entry
exists exactly when its change does: a change that fails writes nothing, and nothing is
recorded that did not happen. Adapters only say who acts (``actor``), from where
(``source``) and, optionally, why (``reason``); the services default to ``"code"``.

A schedule's entries carry the version the change made, the changed fields as
``{field: [before, after]}`` of its editable configuration (system fields such as
``next_run_at`` are never part of it) and a snapshot of that configuration, so any version
can be read back and restored (``services.schedules.restore_schedule``). The trail is kept
when its schedule is deleted, and ``prune`` removes it only when asked (``prune_entries``).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import QuerySet

from ..clock import iso_utc
from ..errors import ScheduleNotFound, UnknownVersion, ValidationError
from ..models import AuditAction, AuditEntry, AuditSource, AuditTarget, Schedule
from ..text import storable, unstorable

MAX_ACTOR = 200
MAX_REASON = 1000
CODE = "code"

# The editable configuration of a schedule: what a snapshot holds and a diff compares
# (``name`` identifies it and never changes; next_run_at, created_at, updated_at and version are
# the system's).
CONFIG_FIELDS = (
    "task_name",
    "args",
    "kwargs",
    "kind",
    "interval_seconds",
    "cron",
    "timezone",
    "run_at",
    "start_at",
    "paused",
    "max_attempts",
    "retry_base_seconds",
    "retry_max_seconds",
    "retry_jitter",
    "catch_up",
    "overlap",
    "queue",
)


# ------------------------------------------------------------------ who, from where, why


def clean_actor(actor: Any) -> str:
    """Who acts: a non-empty text of at most 200 characters. Text no database can store is
    escaped, not refused: a name must never stop an operator's action (as in the run history)."""
    if not isinstance(actor, str) or not actor.strip():
        raise ValidationError("actor (who acts) must be a non-empty string", field="actor")
    if len(actor) > MAX_ACTOR:
        raise ValidationError(f"actor is longer than {MAX_ACTOR} characters", field="actor")
    return storable(actor)[:MAX_ACTOR]


def clean_source(source: Any) -> str:
    if source not in AuditSource.values:
        raise ValidationError(f"source must be one of {', '.join(AuditSource.values)}", field="source")
    return str(source)


def clean_reason(reason: Any) -> str:
    if reason is None:
        return ""
    if not isinstance(reason, str):
        raise ValidationError("reason must be text", field="reason")
    if len(reason) > MAX_REASON:
        raise ValidationError(f"reason is longer than {MAX_REASON} characters", field="reason")
    if (problem := unstorable(reason)) is not None:
        raise ValidationError(f"reason contains {problem}", field="reason")
    return reason


def who(actor: Any, source: Any, reason: Any) -> tuple[str, str, str]:
    """``(actor, source, reason)`` checked, before anything is written."""
    return clean_actor(actor), clean_source(source), clean_reason(reason)


# ------------------------------------------------------------------ schedules' versions


def _json(value: Any) -> Any:
    return iso_utc(value) if isinstance(value, datetime) else value


def snapshot(schedule: Schedule) -> dict[str, Any]:
    """The schedule's editable configuration, JSON-ready (times in ISO 8601, UTC)."""
    return {"name": schedule.name, **{f: _json(getattr(schedule, f)) for f in CONFIG_FIELDS}}


def diff(before: dict[str, Any], after: dict[str, Any]) -> dict[str, list[Any]]:
    """``{field: [before, after]}`` for each configuration field that differs."""
    return {f: [before.get(f), after.get(f)] for f in CONFIG_FIELDS if before.get(f) != after.get(f)}


def record(
    *,
    kind: str,
    target: str,
    action: str,
    now: datetime,
    who: tuple[str, str, str],
    version: int | None = None,
    schedule_id: int | None = None,
    changes: dict[str, list[Any]] | None = None,
    snapshot: dict[str, Any] | None = None,
    data: dict[str, Any] | None = None,
) -> AuditEntry:
    """Write one entry, in the caller's transaction: the one of the change it records."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("an audit entry belongs in the transaction of its change")
    actor, source, reason = who
    return AuditEntry.objects.create(
        target_kind=kind, target=target, schedule_id=schedule_id, version=version, action=action, actor=actor,
        source=source, reason=reason, changes=changes or {}, snapshot=snapshot, data=data, created_at=now,
    )  # fmt: skip


def record_schedule(
    schedule: Schedule,
    action: str,
    *,
    now: datetime,
    who: tuple[str, str, str],
    changes: dict[str, list[Any]] | None = None,
    snapshot_of: dict[str, Any] | None = None,
    data: dict[str, Any] | None = None,
) -> AuditEntry:
    """An entry of ``schedule`` at its (already bumped) version."""
    return record(
        kind=AuditTarget.SCHEDULE, target=schedule.name, action=action, now=now, who=who, version=schedule.version,
        schedule_id=schedule.pk, changes=changes, snapshot=snapshot_of or snapshot(schedule), data=data,
    )  # fmt: skip


def last_version(name: str) -> int:
    """The highest version the name has had (0: none), so a schedule created again under a
    deleted one's name goes on from there and a name's versions never repeat."""
    entry = (
        AuditEntry.objects.filter(target_kind=AuditTarget.SCHEDULE, target=name, version__isnull=False)
        .order_by("-version")
        .values_list("version", flat=True)
        .first()
    )
    return entry or 0


def schedule_history(name: Any) -> QuerySet[AuditEntry]:
    """The name's entries, newest first: also those of a deleted schedule of that name.
    ``ScheduleNotFound`` when there is neither a schedule nor any history by that name."""
    if not isinstance(name, str) or unstorable(name) is not None:
        raise ScheduleNotFound(f"no schedule named {name!r}")
    entries = AuditEntry.objects.filter(target_kind=AuditTarget.SCHEDULE, target=name).order_by("-id")
    if not entries.exists() and not Schedule.objects.filter(name=name).exists():
        raise ScheduleNotFound(f"no schedule named {name!r}")
    return entries


def version_entry(name: str, version: Any) -> AuditEntry:
    """The entry that made version ``version`` of the name (``UnknownVersion`` if none did)."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValidationError("version must be a whole number from 1", field="version")
    entry = (
        AuditEntry.objects.filter(target_kind=AuditTarget.SCHEDULE, target=name, version=version)
        .exclude(action__in=[AuditAction.TRIGGER])
        .first()
    )
    if entry is None or entry.snapshot is None:
        raise UnknownVersion(f"schedule {name!r} has no version {version}")
    return entry


def changes_text(changes: dict[str, list[Any]]) -> str:
    """``cron: "0 3 * * *" -> "0 4 * * *"; paused: false -> true``."""
    return "; ".join(
        f"{field}: {json.dumps(before)} -> {json.dumps(after)}" for field, (before, after) in changes.items()
    )


def describe(entry: AuditEntry) -> str:
    """What an entry did, in one line (the CLI's and the admin's history)."""
    data = entry.data or {}
    if entry.action == AuditAction.TRIGGER:
        return f"run {data.get('run')}"
    if entry.action == AuditAction.DELETE:
        return f"{data.get('runs', 0)} run(s) kept"
    if entry.action == AuditAction.CREATE:
        return "created"
    text = changes_text(entry.changes)
    if entry.action == AuditAction.RESTORE:
        return f"version {data.get('restored')} restored" + (f": {text}" if text else ", nothing differed")
    return text or "-"


def entries(*, kind: str | None = None, target: str | None = None) -> QuerySet[AuditEntry]:
    """The action log, newest first, optionally of one kind of target (and one target)."""
    qs = AuditEntry.objects.order_by("-id")
    if kind is not None:
        qs = qs.filter(target_kind=kind)
    if target is not None:
        qs = qs.filter(target=target)
    return qs


def prune_entries(*, older_than: timedelta, now: datetime, dry_run: bool = False) -> int:
    """Delete the entries older than ``now - older_than`` (``distsched prune --audit-older-than``);
    nothing else ever deletes them. Returns how many were (or would be) deleted."""
    if not isinstance(older_than, timedelta) or older_than <= timedelta(0):
        raise ValidationError("audit_older_than must be a positive duration", field="audit_older_than")
    try:
        cutoff = now - older_than
    except OverflowError:
        raise ValidationError("audit_older_than reaches before year 1", field="audit_older_than") from None
    old = AuditEntry.objects.filter(created_at__lt=cutoff)
    if dry_run:
        return old.count()
    with transaction.atomic():
        deleted, _ = old.delete()
    return deleted
