"""Schedule lifecycle: create, read, update, delete, pause, resume, trigger."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from django.db import IntegrityError, connection, transaction

from .. import tracing
from ..conf import conf
from ..db import runs as db_runs
from ..errors import DuplicateName, ScheduleNotFound, ValidationError
from ..models import Origin, Run, RunEvent, RunState, Schedule, ScheduleKind, Worker
from ..recurrence import Recurrence, first_slot, upcoming
from ..text import unstorable
from . import limit_rules
from .validation import validate_name, validate_schedule_fields

RECURRENCE_FIELDS = frozenset({"kind", "interval_seconds", "cron", "timezone", "run_at", "start_at"})
UPDATABLE_FIELDS = frozenset(
    {
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
    }
)


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


def create_schedule(*, name: str, task_name: str, now: datetime, **options: Any) -> Schedule:
    """Validate everything, then insert the schedule with its first ``next_run_at``."""
    unknown = set(options) - UPDATABLE_FIELDS
    if unknown:
        raise ValidationError(f"unknown schedule option(s): {', '.join(sorted(unknown))}")
    validate_name(name)
    fields = validate_schedule_fields({"task_name": task_name, **options}, now=now)
    _check_limit_keys(fields)
    schedule = Schedule(name=name, created_at=now, updated_at=now, **fields)
    schedule.next_run_at = first_slot(recurrence_of(schedule), now=now, start_at=schedule.start_at)
    try:
        with transaction.atomic():
            schedule.save(force_insert=True)
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


def update_schedule(name: str, *, now: datetime, **changes: Any) -> Schedule:
    """Change fields; a changed recurrence restarts from ``now``."""
    unknown = set(changes) - UPDATABLE_FIELDS
    if unknown:
        raise ValidationError(f"unknown or read-only field(s): {', '.join(sorted(unknown))}")
    with transaction.atomic():
        schedule = _locked(name)
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
        schedule.updated_at = now
        schedule.save()
    return schedule


def delete_schedule(name: str) -> None:
    """Delete the schedule and, with it, its runs and their history.

    Set-based deletes: Django's cascade would load every run and event of the
    schedule into memory first.
    """
    with transaction.atomic():
        schedule = _locked(name)
        RunEvent.objects.filter(run__schedule_id=schedule.pk).delete()
        Worker.objects.filter(current_run__schedule_id=schedule.pk).update(current_run=None)
        with connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {connection.ops.quote_name(Run._meta.db_table)} WHERE schedule_id = %s",  # noqa: S608
                [schedule.pk],
            )
        schedule.delete()


def pause_schedule(name: str, *, now: datetime) -> Schedule:
    """Stop generating runs; runs already created carry on."""
    return _set_paused(name, True, now=now)


def resume_schedule(name: str, *, now: datetime) -> Schedule:
    """Generate runs again. ``next_run_at`` is kept: the next tick applies the
    schedule's catch-up policy to the slots missed while paused, so resuming
    never floods."""
    return _set_paused(name, False, now=now)


def _set_paused(name: str, paused: bool, *, now: datetime) -> Schedule:
    with transaction.atomic():
        schedule = _locked(name)
        if schedule.paused != paused:
            schedule.paused = paused
            schedule.updated_at = now
            schedule.save(update_fields=["paused", "updated_at"])
    return schedule


def trigger_schedule(name: str, *, now: datetime, message: str = "triggered manually") -> Run:
    """Create one manual run now, whatever the schedule's state or slots.

    One statement on PostgreSQL, two on SQLite (``db.runs.insert_triggered``):
    the schedule row supplies task, payload, budget and queue inside the INSERT.
    The returned run carries ``schedule_name`` (as list queries annotate it).
    """
    name = _lookup_name(name)
    with tracing.producer(lambda: (f"trigger {name}", {"distsched.schedule": name})) as span:
        triggered = db_runs.insert_triggered(name, now=now, message=message, trace_context=tracing.carrier())
        if triggered is None:
            raise ScheduleNotFound(f"no schedule named {name!r}")
        span.set("messaging.message.id", str(triggered.run_id))
        span.set("messaging.destination.name", triggered.queue)
        span.set("distsched.task", triggered.task_name)
    run = Run(
        pk=triggered.run_id, schedule_id=triggered.schedule_id, task_name=triggered.task_name,
        args=triggered.args, kwargs=triggered.kwargs, state=RunState.PENDING, scheduled_for=now, available_at=now,
        max_attempts=triggered.max_attempts, queue=triggered.queue, origin=Origin.MANUAL,
        idempotency_key=f"{Origin.MANUAL.value}:{triggered.run_id}", created_at=now, updated_at=now,
        trace_context=triggered.trace_context,
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
