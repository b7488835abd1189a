"""Celery beat's schedules as distsched schedules (``distsched import celery-beat``).

``translate`` turns a ``CELERY_BEAT_SCHEDULE`` dict (``name -> {"task", "schedule", "args",
"kwargs", "options"}``) into declarations of ``DISTSCHED["SCHEDULES"]``'s shape, and says for
each entry it cannot translate why. Celery need not be installed: a ``crontab`` is recognised by
its ``_orig_minute`` ... ``_orig_month_of_year`` attributes, a ``schedule`` by ``run_every``, a
``solar`` by ``event`` and ``lat``; in JSON a crontab is ``{"crontab": {"minute": ..., ...}}``.
``periodic_task_entry`` reads a django-celery-beat ``PeriodicTask`` row the same way.

``import_schedules`` writes them as ordinary schedules (not declared: an operator owns them),
creating those that do not exist; an existing one is left as it is and said so, so importing
twice changes nothing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

from ..errors import DistschedError, DuplicateName
from ..models import AuditSource, Schedule
from ..registry import registry
from . import audit, schedules
from .declared_schedules import normalized

CRON_FIELDS = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
DAY_NAMES = ("sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday")
NOTE_OPTIONS = {
    "priority": "priority is not carried: a schedule's runs have priority 0 (Celery's 0-9 is not our -100..100)",
    "expires": "expires has no equivalent: a run waits until a worker claims it (overlap='skip' avoids a pile-up)",
}


class Untranslatable(Exception):
    """Why one entry has no distsched equivalent."""


@dataclass
class Translation:
    """The declarations (name -> fields), each one's notes, and the entries left out with why."""

    schedules: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: dict[str, list[str]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def translate(beat_schedule: Any, *, timezone: str = "UTC") -> Translation:
    """Every entry of ``beat_schedule`` translated, or skipped with its reason. Names become slugs
    (``"add every 30s"`` -> ``add-every-30s``), noted when they change."""
    if not isinstance(beat_schedule, dict):
        raise DistschedError(f"a beat schedule is a dict of name -> entry, not {type(beat_schedule).__name__}")
    out = Translation()
    for raw_name, entry in beat_schedule.items():
        name = _slug(str(raw_name), taken=out.schedules.keys() | out.skipped.keys())
        notes = [f"renamed from {raw_name!r}"] if name != raw_name else []
        try:
            out.schedules[name] = _entry(entry, timezone=timezone, notes=notes)
        except Untranslatable as exc:
            out.skipped[name] = str(exc)
            continue
        if notes:
            out.notes[name] = notes
    return out


def _slug(name: str, *, taken: Any) -> str:
    base = re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-")[:95] or "beat"
    slug, n = base, 1
    while slug in taken:
        n += 1
        slug = f"{base}-{n}"
    return slug


def _entry(entry: Any, *, timezone: str, notes: list[str]) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise Untranslatable(f"an entry is a dict with 'task' and 'schedule', not {type(entry).__name__}")
    task = entry.get("task")
    if not isinstance(task, str) or not task:
        raise Untranslatable("it names no task")
    out: dict[str, Any] = {"task": task, **_when(entry.get("schedule"), timezone=timezone)}
    if task not in registry:
        notes.append(
            f"task {task!r} is not registered here: declare it with @task (a framework task by its module path)"
        )
    args, kwargs = entry.get("args"), entry.get("kwargs")
    if args:
        if not isinstance(args, list | tuple):
            raise Untranslatable(f"args must be a list, not {type(args).__name__}")
        out["args"] = list(args)
    if kwargs:
        if not isinstance(kwargs, dict):
            raise Untranslatable(f"kwargs must be a dict, not {type(kwargs).__name__}")
        out["kwargs"] = dict(kwargs)
    options = entry.get("options") or {}
    if not isinstance(options, dict):
        raise Untranslatable(f"options must be a dict, not {type(options).__name__}")
    for key, value in options.items():
        if key == "queue" and isinstance(value, str):
            out["queue"] = value
        elif key in NOTE_OPTIONS:
            notes.append(NOTE_OPTIONS[key])
        else:
            notes.append(f"option {key!r} is not carried")
    if entry.get("relative"):
        notes.append("relative=True is not carried: intervals count from the schedule's creation")
    if entry.get("enabled") is False:
        out["paused"] = True
    if entry.get("one_off"):
        notes.append("one_off is not carried: the schedule keeps firing (a run_at schedule fires once)")
    return out


def _when(schedule: Any, *, timezone: str) -> dict[str, Any]:
    """``{"interval_seconds": N}`` or ``{"cron": ..., "timezone": ...}``, or ``Untranslatable``."""
    if isinstance(schedule, dict) and set(schedule) == {"crontab"}:
        return _cron(schedule["crontab"], timezone=timezone)
    if isinstance(schedule, dict) and set(schedule) == {"interval_seconds"}:
        schedule = schedule["interval_seconds"]
    if hasattr(schedule, "event") and hasattr(schedule, "lat"):
        raise Untranslatable(f"solar schedules ({schedule.event}) have no equivalent; use a cron in a time zone")
    if all(hasattr(schedule, f"_orig_{f}") for f in CRON_FIELDS):
        fields = {f: getattr(schedule, f"_orig_{f}") for f in CRON_FIELDS}
        second = getattr(schedule, "_orig_second", 0)  # crontabs extended with seconds
        if second not in (0, "0"):
            fields["second"] = second
        zone = getattr(schedule, "tz", None)  # a crontab of its own zone (some Celery versions)
        return _cron(fields, timezone=str(zone) if zone else timezone)
    if isinstance(getattr(schedule, "run_every", None), timedelta):
        schedule = schedule.run_every
    if isinstance(schedule, timedelta):
        schedule = schedule.total_seconds()
    if isinstance(schedule, int | float) and not isinstance(schedule, bool):
        if schedule < 1 or schedule != int(schedule):
            raise Untranslatable(f"every {schedule:g}s: distsched intervals are whole seconds, at least 1")
        return {"interval_seconds": int(schedule)}
    raise Untranslatable(f"schedule {schedule!r} is not an interval (seconds, timedelta) or a crontab")


def _cron(fields: Any, *, timezone: str) -> dict[str, Any]:
    if not isinstance(fields, dict):
        raise Untranslatable("a crontab is a dict of minute, hour, day_of_month, month_of_year, day_of_week")
    extra = sorted(set(fields) - set(CRON_FIELDS))
    if extra:
        raise Untranslatable(f"crontab field(s) {', '.join(extra)} have no equivalent (cron has minutes, not seconds)")
    parts = {f: _cron_field(fields.get(f, "*"), day_names=f == "day_of_week") for f in CRON_FIELDS}
    if parts["day_of_month"] != "*" and parts["day_of_week"] != "*":
        raise Untranslatable(
            "Celery fires when day_of_month AND day_of_week match; cron fires when either does: no equivalent"
        )
    return {"cron": " ".join(parts[f] for f in CRON_FIELDS), "timezone": timezone}


def _cron_field(value: Any, *, day_names: bool) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, set | frozenset | list | tuple | range):
        return ",".join(str(v) for v in sorted(value))
    if isinstance(value, str):
        text = value.replace(" ", "")
        if day_names:  # Celery takes "monday" and "mon"; cron the three letters
            text = re.sub(r"[A-Za-z]+", lambda m: _day(m.group()), text)
        return text
    raise Untranslatable(f"crontab value {value!r} is not a number, a text or a set")


def _day(word: str) -> str:
    for day in DAY_NAMES:
        if len(word) >= 3 and day.startswith(word.lower()):
            return day[:3]
    return word


# ------------------------------------------------------------------ django-celery-beat


def periodic_task_entry(task: Any) -> dict[str, Any]:
    """A django-celery-beat ``PeriodicTask`` as a beat entry (``translate``'s input); duck-typed,
    so the app need not be installed to test it."""
    entry: dict[str, Any] = {
        "task": task.task,
        "enabled": bool(task.enabled),
        "one_off": getattr(task, "one_off", False),
    }
    for key in ("args", "kwargs"):
        text = getattr(task, key, "") or ""
        try:
            entry[key] = json.loads(text) if isinstance(text, str) else text
        except ValueError:
            entry[key] = text  # translate refuses it, saying why
    options = {k: getattr(task, k, None) for k in ("queue", "priority", "expires")}
    entry["options"] = {k: v for k, v in options.items() if v not in (None, "")}
    if getattr(task, "interval", None) is not None:
        seconds = {"days": 86400, "hours": 3600, "minutes": 60, "seconds": 1, "microseconds": 1e-6}
        entry["schedule"] = task.interval.every * seconds.get(task.interval.period, 1)
    elif getattr(task, "crontab", None) is not None:
        c = task.crontab
        entry["schedule"] = {"crontab": {f: getattr(c, f) for f in CRON_FIELDS}}
        entry["timezone"] = str(getattr(c, "timezone", "") or "")
    elif getattr(task, "solar", None) is not None:
        entry["schedule"] = task.solar
    elif getattr(task, "clocked", None) is not None:
        entry["schedule"] = {"run_at": task.clocked.clocked_time}
    return entry


def translate_periodic_tasks(tasks: Any, *, timezone: str = "UTC") -> Translation:
    """django-celery-beat's rows: a crontab keeps its own time zone, a clocked task becomes a
    once schedule (``run_at``); Celery's own ``celery.backend_cleanup`` is left out."""
    out = Translation()
    for task in tasks:
        if task.task == "celery.backend_cleanup":
            continue
        entry = periodic_task_entry(task)
        zone = entry.pop("timezone", "") or timezone
        when = entry.get("schedule")
        one = translate({task.name: entry}, timezone=zone) if not _clocked(when) else _once(task.name, entry)
        out.schedules |= one.schedules
        out.notes |= one.notes
        out.skipped |= one.skipped
    return out


def _clocked(when: Any) -> bool:
    return isinstance(when, dict) and set(when) == {"run_at"}


def _once(name: str, entry: dict[str, Any]) -> Translation:
    run_at = entry["schedule"]["run_at"]
    one = translate({name: {**entry, "schedule": 1}})
    for key, spec in one.schedules.items():
        spec.pop("interval_seconds")
        spec["run_at"] = run_at.isoformat() if isinstance(run_at, datetime) else run_at
        one.schedules[key] = spec
    return one


def django_celery_beat_tasks() -> list[Any] | None:
    """django-celery-beat's ``PeriodicTask`` rows, or None when that app is not installed."""
    from django.apps import apps

    if not apps.is_installed("django_celery_beat"):
        return None
    model = apps.get_model("django_celery_beat", "PeriodicTask")
    return list(model.objects.select_related("interval", "crontab", "solar", "clocked").order_by("name"))


# ------------------------------------------------------------------ writing


@dataclass(frozen=True)
class Imported:
    name: str
    action: str  # created, exists (left as it is), failed
    message: str = ""


def import_schedules(
    declarations: dict[str, dict[str, Any]], *, now: datetime, actor: str, reason: str, dry_run: bool = False
) -> list[Imported]:
    """Create each schedule that does not exist yet (one transaction each, audited with source
    ``cli``); an existing one is left as it is, with what differs. ``dry_run`` writes nothing."""
    done = []
    for name, spec in declarations.items():
        try:
            done.append(_import_one(name, spec, now=now, actor=actor, reason=reason, dry_run=dry_run))
        except DistschedError as exc:
            done.append(Imported(name, "failed", str(exc)))
    return done


def _import_one(name: str, spec: dict[str, Any], *, now: datetime, actor: str, reason: str, dry_run: bool) -> Imported:
    fields = normalized(name, spec, now=now)
    existing = Schedule.objects.filter(name=name).first()
    if existing is None and not dry_run:
        try:
            with transaction.atomic():
                schedules.create_schedule(
                    name=name, now=now, actor=actor, source=AuditSource.CLI, reason=reason, **fields
                )
            return Imported(name, "created")
        except DuplicateName:
            existing = Schedule.objects.get(name=name)
    if existing is None:
        return Imported(name, "created")
    differs = {f for f, v in fields.items() if getattr(existing, f) != v and f in audit.CONFIG_FIELDS}
    if not differs:
        return Imported(name, "exists", "the same: nothing to do")
    return Imported(name, "exists", f"left as it is; differs in {', '.join(sorted(differs))}")
