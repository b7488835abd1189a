"""Schedules declared in code: ``DISTSCHED["SCHEDULES"]`` (or a file) made true in the database.

``apply_declared`` is idempotent and follows these rules (docs/howto/periodic-tasks.md):

- A declared schedule that does not exist is created (paused if it declares ``"paused": True``).
- The declaration is the schedule's whole configuration: a field it leaves out has the value
  ``schedule create`` would give it. Any difference is written at the next apply, so a field
  changed in code wins, and an operator's edit (of any field but ``paused``) is overwritten.
- ``paused`` is the operator's: apply changes it only when the declaration's own ``paused``
  changed since the last apply, when it creates the schedule, or when it adopts one made by hand
  (a name declared for the first time). An operator's pause or resume otherwise stands.
- A schedule declared before and absent now is paused with the reason "removed from settings"
  and is no longer declared (``prune="pause"``); deleted with ``prune="delete"``; left as it is
  with ``prune="keep"``. A schedule made by hand is never touched.

Each schedule is applied in its own transaction, recorded in the audit trail with source
``settings``; an apply that changes nothing writes nothing. ``Schedule.declared`` marks declared
schedules ({"source", "paused"}: what was last applied). Errors are per schedule: one bad
declaration is reported and the others are applied.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

from django.db import transaction

from ..clock import Clock
from ..conf import conf
from ..errors import DistschedError, DuplicateName, ValidationError
from ..models import AuditSource, Schedule
from . import audit, schedules
from .validation import validate_name, validate_schedule_fields

logger = logging.getLogger("distsched")

SETTINGS = "settings"  # the actor of an apply of DISTSCHED["SCHEDULES"]
REMOVED_REASON = "removed from {label}"  # "removed from settings", or the file's name
PRUNE_MODES = ("pause", "delete", "keep")
ACTIONS = ("created", "updated", "paused", "resumed", "deleted", "unchanged", "failed")
# A declaration's keys -> the schedule's fields.
KEYS = {
    "task": "task_name",
    "interval_seconds": "interval_seconds",
    "cron": "cron",
    "run_at": "run_at",
    "timezone": "timezone",
    "start_at": "start_at",
    "args": "args",
    "kwargs": "kwargs",
    "queue": "queue",
    "max_attempts": "max_attempts",
    "retry_base_seconds": "retry_base_seconds",
    "retry_max_seconds": "retry_max_seconds",
    "retry_jitter": "retry_jitter",
    "catch_up": "catch_up",
    "overlap": "overlap",
    "paused": "paused",
}
KIND_FIELDS = ("kind", "interval_seconds", "cron", "run_at", "timezone")


@dataclass(frozen=True)
class Outcome:
    """What an apply did to one schedule: ``created``, ``updated``, ``paused`` or ``resumed`` (only
    its paused state changed: by the declaration, or a removal), ``deleted``, ``unchanged`` or ``failed``."""

    name: str
    action: str
    changes: dict[str, list[Any]] = field(default_factory=dict)
    message: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "action": self.action, "changes": self.changes, "message": self.message}


@dataclass
class Report:
    outcomes: list[Outcome] = field(default_factory=list)
    dry_run: bool = False

    def count(self, action: str) -> int:
        return sum(1 for o in self.outcomes if o.action == action)

    @property
    def changed(self) -> bool:
        return any(o.action not in ("unchanged", "failed") for o in self.outcomes)

    def summary(self) -> str:
        """``2 created, 1 unchanged``: the actions that happened, counted."""
        return ", ".join(f"{self.count(a)} {a}" for a in ACTIONS if self.count(a)) or "nothing declared"


def declared_in_settings() -> dict[str, Any] | None:
    """``DISTSCHED["SCHEDULES"]``; None when the setting is absent (then nothing is applied)."""
    return conf.SCHEDULES


def declaration_fields(name: Any, spec: Any) -> dict[str, Any]:
    """One declaration as schedule fields (unvalidated values), or ``ValidationError`` naming the
    schedule and the key."""
    validate_name(name)
    if not isinstance(spec, dict):
        raise ValidationError(f"schedule {name!r} must be a dict of its fields, not {type(spec).__name__}")
    unknown = sorted(str(k) for k in spec if k not in KEYS)
    if unknown:
        raise ValidationError(
            f"schedule {name!r} has unknown key(s) {', '.join(unknown)} (known: {', '.join(KEYS)})", field=unknown[0]
        )
    if "task" not in spec:
        raise ValidationError(f"schedule {name!r} needs a 'task'", field="task")
    return {KEYS[k]: v for k, v in spec.items()}


def normalized(name: str, spec: Any, *, now: datetime) -> dict[str, Any]:
    """The full, validated configuration a declaration stands for (``validate_schedule_fields``,
    the rule every schedule passes), errors prefixed with the schedule's name."""
    fields = declaration_fields(name, spec)
    try:
        return validate_schedule_fields(fields, now=now, check_run_at=False)
    except DistschedError as exc:
        key = {"task_name": "task", "kind": None}.get(exc.field or "", exc.field)
        where = f" ({key})" if key else ""
        raise ValidationError(f"schedule {name!r}{where}: {exc}", field=key) from None


def problems(declared: Any, *, now: datetime) -> list[str]:
    """Every invalid declaration, one message each (the system check's)."""
    if declared is None:
        return []
    if not isinstance(declared, dict):
        return [f"must be a dict of schedule name -> fields, not {type(declared).__name__}"]
    found = []
    for name, spec in declared.items():
        try:
            normalized(name, spec, now=now)
        except DistschedError as exc:
            found.append(str(exc) if str(exc).startswith("schedule ") else f"schedule {name!r}: {exc}")
    return found


class _DryRun(Exception):
    """Raised inside a schedule's transaction to roll it back after computing its outcome."""

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome


def apply_declared(
    clock: Clock,
    declared: dict[str, Any],
    *,
    actor: str = SETTINGS,
    source_label: str = SETTINGS,
    prune: str = "pause",
    dry_run: bool = False,
) -> Report:
    """Make the database match ``declared`` (name -> declaration); see the module's rules.
    ``dry_run`` does everything in rolled-back transactions: the report says what would be done."""
    if prune not in PRUNE_MODES:
        raise ValidationError(f"prune must be one of {', '.join(PRUNE_MODES)}", field="prune")
    if not isinstance(declared, dict):
        raise ValidationError(f"schedules must be a dict of name -> fields, not {type(declared).__name__}")
    report = Report(dry_run=dry_run)
    for name in sorted(declared, key=str):
        report.outcomes.append(
            _one(partial(_apply_one, name, declared[name], clock, actor, source_label), name, dry_run)
        )
    if prune != "keep":
        removed = Schedule.objects.filter(declared__isnull=False).exclude(name__in=[str(n) for n in declared])
        for name in removed.order_by("name").values_list("name", flat=True):
            report.outcomes.append(_one(partial(_remove, name, clock, actor, source_label, prune), name, dry_run))
    return report


def _one(work: Callable[[], Outcome], name: Any, dry_run: bool) -> Outcome:
    """``work`` in its own transaction (rolled back for a dry run); a refused declaration is ``failed``."""
    try:
        with transaction.atomic():
            outcome = work()
            if dry_run:
                raise _DryRun(outcome)
        return outcome
    except _DryRun as done:
        return done.outcome
    except DistschedError as exc:
        return Outcome(str(name), "failed", message=str(exc))


def _who(actor: str, reason: str) -> dict[str, Any]:
    return {"actor": actor, "source": AuditSource.SETTINGS, "reason": reason}


def _apply_one(name: Any, spec: Any, clock: Clock, actor: str, label: str) -> Outcome:
    now = clock.now()
    wanted = normalized(name, spec, now=now)
    paused = wanted.pop("paused")
    marker = {"source": label, "paused": paused}
    reason = f"declared in {label}"
    schedule = _locked(name)
    if schedule is None:
        try:
            with transaction.atomic():
                created = schedules.create_schedule(name=name, now=now, **_who(actor, reason), **wanted, paused=paused)
        except DuplicateName:  # another ticker created it since we looked: apply to theirs
            schedule = Schedule.objects.select_for_update().get(name=name)
        else:
            Schedule.objects.filter(pk=created.pk).update(declared=marker)
            return Outcome(name, "created", message=f"{_spec(created)}, task {created.task_name}")
    before = audit.snapshot(schedule)
    changes = {f: v for f, v in wanted.items() if getattr(schedule, f) != v}
    if changes.keys() & set(KIND_FIELDS):
        changes |= {f: wanted[f] for f in KIND_FIELDS}
    if changes:
        schedule = schedules.update_schedule(name, now=now, **_who(actor, reason), **changes)
    last: dict[str, Any] | None = schedule.declared
    adopting = last is None
    if (last is None or last.get("paused") != paused) and schedule.paused != paused:
        toggle = schedules.pause_schedule if paused else schedules.resume_schedule
        schedule = toggle(name, now=now, **_who(actor, reason))
    if schedule.declared != marker:
        Schedule.objects.filter(pk=schedule.pk).update(declared=marker)
    diff = audit.diff(before, audit.snapshot(schedule))
    note = "now declared (was made by hand)" if adopting else ""
    if not diff:
        return Outcome(name, "unchanged", message=note)
    action = "updated" if set(diff) - {"paused"} else "paused" if schedule.paused else "resumed"
    return Outcome(name, action, diff, message=note or audit.changes_text(diff))


def _locked(name: str) -> Schedule | None:
    """The schedule of that name, locked until the end of the transaction (None: none yet)."""
    return Schedule.objects.select_for_update().filter(name=name).first()


def _remove(name: str, clock: Clock, actor: str, label: str, prune: str) -> Outcome:
    now = clock.now()
    reason = REMOVED_REASON.format(label=label)
    schedule = Schedule.objects.select_for_update().filter(name=name, declared__isnull=False).first()
    if schedule is None:  # removed or undeclared by a concurrent apply
        return Outcome(name, "unchanged")
    if prune == "delete":
        kept = schedules.delete_schedule(name, now=now, **_who(actor, reason))
        return Outcome(name, "deleted", message=f"{reason}; its {kept} run(s) are kept")
    was_paused = schedule.paused
    if not was_paused:
        schedules.pause_schedule(name, now=now, **_who(actor, reason))
    Schedule.objects.filter(pk=schedule.pk).update(declared=None)
    if was_paused:
        return Outcome(name, "unchanged", message=f"{reason}; already paused, no longer declared")
    return Outcome(name, "paused", {"paused": [False, True]}, message=f"{reason}; no longer declared")


def _spec(schedule: Schedule) -> str:
    if schedule.kind == "interval":
        return f"every {schedule.interval_seconds}s"
    if schedule.kind == "cron":
        return f"cron {schedule.cron} ({schedule.timezone})"
    return "once"


def apply_at_startup(clock: Clock, *, process: str) -> Report | None:
    """Apply ``DISTSCHED["SCHEDULES"]`` as a ticker starts (``tick --loop``, ``runworker
    --with-tick``): nothing when the setting is absent; never raises (an apply that fails is
    logged and the process goes on ticking what the database holds)."""
    declared = declared_in_settings()
    if declared is None:
        return None
    try:
        report = apply_declared(clock, declared)
    except Exception as exc:  # the ticker must start even if the apply cannot
        logger.error(
            "declared schedules not applied",
            exc_info=True,
            extra={"distsched": {"process": process, "error": f"{type(exc).__name__}: {exc}"}},
        )
        return None
    for o in report.outcomes:
        if o.action == "failed":
            logger.error("declared schedule not applied: %s", o.message, extra={"distsched": {"schedule": o.name}})
        elif o.action != "unchanged":
            logger.info("declared schedule %s", o.action, extra={"distsched": {"schedule": o.name, "what": o.message}})
    logger.info("declared schedules applied", extra={"distsched": {"process": process, "summary": report.summary()}})
    return report
