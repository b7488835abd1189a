"""Schedule lifecycle: create, read, update, delete, pause, resume, trigger, restore.

Every change is recorded in its own transaction (``services.audit``): a new ``version``, who
(``actor``), from where (``source``), why (``reason``), the changed fields and a snapshot of the
configuration. A change that changes nothing (pausing a paused schedule, an update to the same
values) writes nothing and makes no version. A trigger is recorded at the version in force: it
makes a run, not a new configuration. Deleting a schedule keeps its runs and their events: the
runs keep its name (``Run.deleted_schedule``); its waiting runs are cancelled and its running
ones asked to stop, as an operator's cancel would.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from django.db import IntegrityError, transaction

from .. import tracing
from ..conf import conf
from ..db import runs as db_runs
from ..errors import DuplicateName, ScheduleNotFound, ValidationError, VersionConflict
from ..models import ACTIVE_STATES, AuditAction, AuditSource, AuditTarget, Origin, Run, RunState, Schedule, ScheduleKind
from ..recurrence import Recurrence, first_slot, upcoming
from ..text import unstorable
from . import audit, limit_rules
from .enqueue import declared_priority
from .runs import cancel_locked
from .validation import validate_name, validate_schedule_fields

RECURRENCE_FIELDS = frozenset({"kind", "interval_seconds", "cron", "timezone", "run_at", "start_at"})
# What an update may change: the editable configuration the audit trail records (one list).
UPDATABLE_FIELDS = frozenset(audit.CONFIG_FIELDS)


class RecurrenceFields(Protocol):
    """What ``recurrence_of`` reads: a Schedule, or the tick's lighter row."""

    kind: str
    interval_seconds: int | None
    cron: str
    timezone: str
    run_at: datetime | None


def recurrence_of(schedule: RecurrenceFields) -> Recurrence:
    return Recurrence(
        kind=schedule.kind,
        interval_seconds=schedule.interval_seconds,
        cron=schedule.cron,
        timezone=schedule.timezone,
        run_at=schedule.run_at,
    )


def upcoming_fire_times(schedule: Schedule, count: int = 5) -> list[datetime]:
    """The next ``count`` fire times, starting at ``next_run_at``."""
    return upcoming(recurrence_of(schedule), schedule.next_run_at, count)


def get_schedule(name: str) -> Schedule:
    try:
        return Schedule.objects.get(name=_lookup_name(name))
    except Schedule.DoesNotExist:
        raise ScheduleNotFound(f"no schedule named {name!r}") from None


def _lookup_name(name: object) -> str:
    """Names that could never have been created are simply not found (an
    unstorable one would make the database driver raise instead)."""
    if not isinstance(name, str) or unstorable(name) is not None:
        raise ScheduleNotFound(f"no schedule named {name!r}")
    return name


def list_schedules(*, paused: bool | None = None) -> list[Schedule]:
    qs = Schedule.objects.all()
    if paused is not None:
        qs = qs.filter(paused=paused)
    return list(qs)


def create_schedule(
    *,
    name: str,
    task_name: str,
    now: datetime,
    actor: str = audit.CODE,
    source: str = AuditSource.CODE,
    reason: str = "",
    **options: Any,
) -> Schedule:
    """Validate everything, then insert the schedule with its first ``next_run_at`` and its
    ``create`` entry. A name a deleted schedule had goes on with that name's version numbers."""
    unknown = set(options) - UPDATABLE_FIELDS
    if unknown:
        raise ValidationError(f"unknown schedule option(s): {', '.join(sorted(unknown))}")
    validate_name(name)
    fields = validate_schedule_fields({"task_name": task_name, **options}, now=now)
    _check_limit_keys(fields)
    by = audit.who(actor, source, reason)
    schedule = Schedule(name=name, created_at=now, updated_at=now, **fields)
    schedule.next_run_at = first_slot(recurrence_of(schedule), now=now, start_at=schedule.start_at)
    try:
        with transaction.atomic():
            schedule.save(force_insert=True)
            # Read after the insert: a concurrent delete of this name has committed its entry by the
            # time our insert got past the unique name (distsched_audit_version decides in the end).
            version = audit.last_version(name) + 1
            if version != schedule.version:
                schedule.version = version
                Schedule.objects.filter(pk=schedule.pk).update(version=version)
            after = audit.snapshot(schedule)
            audit.record_schedule(
                schedule, AuditAction.CREATE, now=now, who=by, changes=audit.diff({}, after), snapshot_of=after
            )
    except IntegrityError:
        # The unique index decides, even when two creators race.
        if Schedule.objects.filter(name=name).exists():
            raise DuplicateName(f"a schedule named {name!r} already exists") from None
        raise
    return schedule


def _check_limit_keys(fields: dict[str, Any]) -> None:
    """A schedule's runs under a limit with ``missing="error"`` must carry its partition key
    (``LimitKeyMissing`` otherwise), as an enqueued run must."""
    if conf.LIMITS:
        limit_rules.keys_for(
            fields["task_name"], fields.get("queue") or "default", fields.get("args") or [], fields.get("kwargs") or {}
        )


def update_schedule(
    name: str,
    *,
    now: datetime,
    expected_version: int | None = None,
    actor: str = audit.CODE,
    source: str = AuditSource.CODE,
    reason: str = "",
    **changes: Any,
) -> Schedule:
    """Change fields; a changed recurrence restarts from ``now``. With ``expected_version``, the
    change is refused (``VersionConflict``) when the schedule is at another version by now."""
    unknown = set(changes) - UPDATABLE_FIELDS
    if unknown:
        raise ValidationError(f"unknown or read-only field(s): {', '.join(sorted(unknown))}")
    by = audit.who(actor, source, reason)
    _check_expected(expected_version)
    with transaction.atomic():
        schedule = _locked(name)
        _check_version(schedule, expected_version)
        before = audit.snapshot(schedule)
        _apply_changes(schedule, changes, now=now)
        _save_version(schedule, AuditAction.UPDATE, before, now=now, who=by)
    return schedule


def restore_schedule(
    name: str,
    version: Any,
    *,
    now: datetime,
    expected_version: int | None = None,
    actor: str = audit.CODE,
    source: str = AuditSource.CODE,
    reason: str = "",
) -> Schedule:
    """Bring back the configuration of version ``version`` as a new version (history is never
    rewritten); ``UnknownVersion`` if the name never had it. Whether the schedule is paused stays
    as it is (pause and resume say that), and a changed recurrence restarts from ``now``."""
    by = audit.who(actor, source, reason)
    _check_expected(expected_version)
    with transaction.atomic():
        schedule = _locked(name)
        _check_version(schedule, expected_version)
        entry = audit.version_entry(schedule.name, version)
        before = audit.snapshot(schedule)
        kept: dict[str, Any] = entry.snapshot or {}
        wanted = {f: kept[f] for f in UPDATABLE_FIELDS - {"paused"} if f in kept}
        _apply_changes(schedule, {f: v for f, v in wanted.items() if before.get(f) != v}, now=now)
        _save_version(schedule, AuditAction.RESTORE, before, now=now, who=by, always=True, data={"restored": version})
    return schedule


def _check_expected(expected_version: Any) -> None:
    if expected_version is not None and (
        isinstance(expected_version, bool) or not isinstance(expected_version, int) or expected_version < 1
    ):
        raise ValidationError("expected_version must be a whole number from 1", field="expected_version")


def _check_version(schedule: Schedule, expected_version: int | None) -> None:
    if expected_version is not None and schedule.version != expected_version:
        raise VersionConflict(
            f"schedule {schedule.name} is at version {schedule.version}, not {expected_version}: "
            "it was changed since; read it again",
            current=schedule.version,
        )


def _save_version(
    schedule: Schedule,
    action: str,
    before: dict[str, Any],
    *,
    now: datetime,
    who: tuple[str, str, str],
    always: bool = False,
    data: dict[str, Any] | None = None,
) -> None:
    """Save the changed schedule as its next version with its entry; nothing when nothing
    changed (unless ``always``: a restore is recorded even when it changed no field)."""
    after = audit.snapshot(schedule)
    changed = audit.diff(before, after)
    if not changed and not always:
        return
    schedule.version += 1
    schedule.updated_at = now
    schedule.save()
    audit.record_schedule(schedule, action, now=now, who=who, changes=changed, snapshot_of=after, data=data)


def _apply_changes(schedule: Schedule, changes: dict[str, Any], *, now: datetime) -> None:
    """Validate the schedule with ``changes`` merged in and set them on it (unsaved)."""
    current = {f: getattr(schedule, f) for f in UPDATABLE_FIELDS}
    kind_fields = {"interval_seconds", "cron", "run_at"}
    if kind_fields & set(changes):
        # Switching kind: the fields of the old kind are cleared unless given.
        for f in kind_fields - set(changes):
            current[f] = None
        if "cron" not in changes and "timezone" not in changes:
            current["timezone"] = None  # leaving cron: the zone goes with it
        if "kind" not in changes:
            current["kind"] = None
    merged = {**current, **changes}
    fields = validate_schedule_fields(merged, now=now, check_run_at="run_at" in changes)
    _check_limit_keys({**current, **fields})
    recurrence_changed = any(fields[f] != current.get(f) for f in RECURRENCE_FIELDS if f in fields)
    for key, value in fields.items():
        setattr(schedule, key, value)
    if recurrence_changed:
        if schedule.kind == ScheduleKind.ONCE and schedule.run_at is not None and schedule.run_at < now:
            schedule.next_run_at = None
        else:
            schedule.next_run_at = first_slot(recurrence_of(schedule), now=now, start_at=schedule.start_at)


def delete_schedule(
    name: str, *, now: datetime, actor: str = audit.CODE, source: str = AuditSource.CODE, reason: str = ""
) -> int:
    """Delete the schedule; its runs and their events stay, keeping its name
    (``Run.deleted_schedule``). Its waiting runs are cancelled and its running ones asked to
    stop, as an operator's cancel would; the ``delete`` entry keeps the configuration as it
    was. Returns how many runs were kept.

    One set-based UPDATE detaches the runs: Django's SET_NULL would load every run first.
    """
    by = audit.who(actor, source, reason)
    with transaction.atomic():
        schedule = _locked(name)
        why = f"with its schedule {schedule.name} (deleted by {by[0]})"
        for run in Run.objects.select_for_update().filter(schedule_id=schedule.pk, state__in=ACTIVE_STATES):
            cancel_locked(run, now=now, reason=why)
        kept = Run.objects.filter(schedule_id=schedule.pk).update(schedule=None, deleted_schedule=schedule.name)
        before = audit.snapshot(schedule)
        schedule.version += 1
        audit.record_schedule(schedule, AuditAction.DELETE, now=now, who=by, snapshot_of=before, data={"runs": kept})
        schedule.delete()
    return kept


def pause_schedule(
    name: str, *, now: datetime, actor: str = audit.CODE, source: str = AuditSource.CODE, reason: str = ""
) -> Schedule:
    """Stop generating runs; runs already created carry on. ``reason`` says why, for whoever looks later."""
    return _set_paused(name, True, now=now, who=audit.who(actor, source, reason))


def resume_schedule(
    name: str, *, now: datetime, actor: str = audit.CODE, source: str = AuditSource.CODE, reason: str = ""
) -> Schedule:
    """Generate runs again. ``next_run_at`` is kept: the next tick applies the
    schedule's catch-up policy to the slots missed while paused, so resuming
    never floods."""
    return _set_paused(name, False, now=now, who=audit.who(actor, source, reason))


def _set_paused(name: str, paused: bool, *, now: datetime, who: tuple[str, str, str]) -> Schedule:
    with transaction.atomic():
        schedule = _locked(name)
        if schedule.paused != paused:
            schedule.paused = paused
            schedule.updated_at = now
            schedule.version += 1
            schedule.save(update_fields=["paused", "updated_at", "version"])
            audit.record_schedule(
                schedule,
                AuditAction.PAUSE if paused else AuditAction.RESUME,
                now=now,
                who=who,
                changes={"paused": [not paused, paused]},
            )
    return schedule


def trigger_schedule(
    name: str,
    *,
    now: datetime,
    message: str = "triggered manually",
    actor: str = audit.CODE,
    source: str = AuditSource.CODE,
    reason: str = "",
) -> Run:
    """Create one manual run now, whatever the schedule's state or slots, and its ``trigger``
    entry (at the schedule's version: a trigger does not change the schedule).

    One statement on PostgreSQL, two on SQLite (``db.runs.insert_triggered``), plus the entry:
    the schedule row supplies task, payload, budget, queue and version inside the INSERT.
    The returned run carries ``schedule_name`` (as list queries annotate it).
    """
    name = _lookup_name(name)
    by = audit.who(actor, source, reason)
    with tracing.producer(lambda: (f"trigger {name}", {"distsched.schedule": name})) as span:
        # No savepoint in a caller's transaction (two statements fewer): nothing is raised inside
        # this block on purpose, so only a database error (which fails that transaction anyway)
        # can leave it early.
        with transaction.atomic(savepoint=False):
            triggered = db_runs.insert_triggered(name, now=now, message=message, trace_context=tracing.carrier())
            priority = 0
            if triggered is not None:
                # Schedules have no priority: the run takes its task's declared one (a statement
                # more only for a task that declares one).
                priority = declared_priority(triggered.task_name)
                if priority:
                    Run.objects.filter(pk=triggered.run_id).update(priority=priority)
                audit.record(
                    kind=AuditTarget.SCHEDULE, target=name, action=AuditAction.TRIGGER, now=now, who=by,
                    version=triggered.schedule_version, schedule_id=triggered.schedule_id,
                    data={"run": triggered.run_id},
                )  # fmt: skip
        if triggered is None:
            raise ScheduleNotFound(f"no schedule named {name!r}")
        span.set("messaging.message.id", str(triggered.run_id))
        span.set("messaging.destination.name", triggered.queue)
        span.set("distsched.task", triggered.task_name)
    run = Run(
        pk=triggered.run_id, schedule_id=triggered.schedule_id, task_name=triggered.task_name,
        args=triggered.args, kwargs=triggered.kwargs, state=RunState.PENDING, scheduled_for=now, available_at=now,
        max_attempts=triggered.max_attempts, queue=triggered.queue, priority=priority, origin=Origin.MANUAL,
        idempotency_key=f"{Origin.MANUAL.value}:{triggered.run_id}", created_at=now, updated_at=now,
        trace_context=triggered.trace_context, schedule_version=triggered.schedule_version,
    )  # fmt: skip
    run._state.adding = False
    run._state.db = "default"
    run.schedule_name = name  # type: ignore[attr-defined]  # like services.queries.runs() annotates it
    return run


def _locked(name: str) -> Schedule:
    try:
        return Schedule.objects.select_for_update().get(name=_lookup_name(name))
    except Schedule.DoesNotExist:
        raise ScheduleNotFound(f"no schedule named {name!r}") from None
