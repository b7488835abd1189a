"""Operators change limits at runtime: set a limit's numbers (or pause it) with a reason and an
expiry, reset it, and see every limit with what holds it.

An override is stored on the limit's ``Limit`` row and wins over the declaration (settings and
``per_partition``) until it expires or is reset; a deploy rewrites only the declaration, so it
never undoes an override. The next claim obeys it: admission reads the overrides in force on
every claim that meets a limited run. Setting, resetting and expiring each write a
``LimitEvent`` (who, when, why, what) in the same transaction, and re-examine the limit's
blocked runs there too, so a raised cap lets them through at once. Each is also an entry of
the operators' action log (``services.audit``), with ``source`` saying where it came from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Count, F, Q

from ..clock import iso_utc
from ..errors import NotFound, ValidationError
from ..models import (
    LEASED_STATES,
    AuditAction,
    AuditSource,
    AuditTarget,
    Limit,
    LimitAction,
    LimitEvent,
    LimitHold,
    Run,
    RunState,
)
from . import audit, limits
from . import limit_rules as rules
from .queues import _actor, _reason

MAX_OVERRIDE_SECONDS = 366 * 86400
TOP_PARTITIONS = 10


class UnknownLimit(NotFound):
    pass


def _spec(name: Any) -> rules.LimitSpec:
    spec = rules.declared().get(name) if isinstance(name, str) else None
    if spec is None:
        raise UnknownLimit(f"no limit named {name!r} is declared in DISTSCHED['LIMITS']")
    return spec


def validate_override(values: Any, spec: rules.LimitSpec | None = None) -> dict[str, Any]:
    """``{"concurrency", "total", "rate", "burst", "local", "paused"}``, each optional (None drops
    that number: unlimited by it). ``total`` only for a limit with partitions, as declarations."""
    if not isinstance(values, dict) or not values:
        raise ValidationError("give at least one of concurrency, total, rate, burst, local, paused", field="override")
    rules.check_numbers(values, allowed=(*rules.NUMBERS, "paused"), where="override")
    if spec is not None and values.get("total") is not None and not spec.partition_by:
        raise ValidationError(
            f"limit {spec.name!r} has no partitions: a total needs partition_by (use concurrency)", field="total"
        )
    return dict(values)


def _until(now: datetime, seconds: Any, until: Any) -> datetime | None:
    if seconds is not None and until is not None:
        raise ValidationError("give an expiry as a duration or a time, not both", field="for")
    if seconds is not None:
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not 1 <= seconds <= MAX_OVERRIDE_SECONDS
        ):
            raise ValidationError(f"for must be 1-{MAX_OVERRIDE_SECONDS} seconds", field="for")
        return now + timedelta(seconds=seconds)
    if until is not None:
        if not isinstance(until, datetime) or until.tzinfo is None or until <= now:
            raise ValidationError("until must be a time zone aware time in the future", field="until")
        if until > now + timedelta(seconds=MAX_OVERRIDE_SECONDS):
            raise ValidationError(f"until must be within {MAX_OVERRIDE_SECONDS // 86400} days", field="until")
        return until
    return None


@dataclass(frozen=True, kw_only=True)
class LimitChange:
    limit: str
    override: dict[str, Any] | None
    until: datetime | None
    released: int  # blocked runs let through by the change


def set_override(
    name: Any,
    values: Any,
    *,
    now: datetime,
    by: Any,
    reason: Any = "",
    for_seconds: Any = None,
    until: Any = None,
    source: str = AuditSource.CODE,
) -> LimitChange:
    """Override the limit's numbers (replacing an earlier override) until ``for_seconds`` from
    now or ``until`` (neither: until reset)."""
    spec = _spec(name)
    override = validate_override(values, spec)
    actor, why, ends = _actor(by), _reason(reason), _until(now, for_seconds, until)
    who = audit.who(actor, source, why)
    with transaction.atomic():
        Limit.objects.bulk_create([Limit(name=spec.name)], ignore_conflicts=True)
        Limit.objects.filter(name=spec.name).update(
            override=override, override_by=actor, override_reason=why, override_at=now, override_until=ends
        )
        LimitEvent.objects.create(
            limit=spec.name, action=LimitAction.SET, actor=actor, reason=why, override=override, until=ends,
            created_at=now,
        )  # fmt: skip
        released = limits.let_all_through(spec.name, now)
        _audited(spec.name, AuditAction.OVERRIDE, now=now, who=who, override=override, until=ends, released=released)
    return LimitChange(limit=spec.name, override=override, until=ends, released=released)


def _audited(
    name: str,
    action: str,
    *,
    now: datetime,
    who: tuple[str, str, str],
    override: dict[str, Any] | None = None,
    until: datetime | None = None,
    released: int = 0,
) -> None:
    data = {"override": override, "until": iso_utc(until) if until else None, "released": released}
    audit.record(kind=AuditTarget.LIMIT, target=name, action=action, now=now, who=who, data=data)


def reset_override(
    name: Any, *, now: datetime, by: Any, reason: Any = "", source: str = AuditSource.CODE
) -> LimitChange:
    """Back to the declared numbers. Idempotent: with no override in force nothing is written."""
    spec = _spec(name)
    actor, why = _actor(by), _reason(reason)
    who = audit.who(actor, source, why)
    with transaction.atomic():
        row = Limit.objects.select_for_update().filter(name=spec.name, override__isnull=False).first()
        if row is not None and row.override_until is not None and row.override_until <= now:
            _expired(row, now)  # its time was up already: it expired (the sweep had not said so yet)
            row = None
        if row is None:
            return LimitChange(limit=spec.name, override=None, until=None, released=0)
        _clear(row.name)
        LimitEvent.objects.create(limit=spec.name, action=LimitAction.RESET, actor=actor, reason=why, created_at=now)
        released = limits.let_all_through(spec.name, now)
        _audited(spec.name, AuditAction.RESET, now=now, who=who, released=released)
    return LimitChange(limit=spec.name, override=None, until=None, released=released)


def _clear(name: str) -> None:
    Limit.objects.filter(name=name).update(
        override=None, override_by="", override_reason="", override_at=None, override_until=None
    )


def expire(now: datetime) -> int:
    """End the overrides whose time is up (an ``expired`` event each); the sweep calls it."""
    released = 0
    for name in Limit.objects.filter(override__isnull=False, override_until__lte=now).values_list("name", flat=True):
        with transaction.atomic():
            row = Limit.objects.select_for_update().filter(name=name, override_until__lte=now).first()
            if row is not None:
                released += _expired(row, now)
    return released


def _expired(row: Limit, now: datetime) -> int:
    """End an override whose time is up: cleared, an ``expired`` event, blocked runs re-examined."""
    _clear(row.name)
    LimitEvent.objects.create(
        limit=row.name, action=LimitAction.EXPIRED, actor="distsched", reason="the override's time is up",
        override=row.override, until=row.override_until, created_at=now,
    )  # fmt: skip
    released = limits.let_all_through(row.name, now) if row.name in rules.declared() else 0
    _audited(
        row.name, AuditAction.EXPIRED, now=now, who=("distsched", AuditSource.SYSTEM, "the override's time is up"),
        override=row.override, until=row.override_until, released=released,
    )  # fmt: skip
    return released


def limit_events(name: Any, *, limit: int = 50) -> list[LimitEvent]:
    spec = _spec(name)
    return list(LimitEvent.objects.filter(limit=spec.name).order_by("-id")[:limit])


@dataclass(frozen=True, kw_only=True)
class LimitStatus:
    """One limit as the API, the CLI, the admin and the metrics show it."""

    name: str
    tasks: list[str]
    queues: list[str]
    declared: dict[str, Any]
    override: dict[str, Any] | None
    override_by: str
    override_reason: str
    override_until: datetime | None
    effective: dict[str, Any]
    partition_by: list[str]
    fair: bool
    in_use: int
    blocked: int
    throttled: int  # waiting runs whose available_at a rate of this limit moved
    saturated_partitions: int
    top_partitions: list[dict[str, Any]] = field(default_factory=list)

    def as_record(self, when: Callable[[datetime | None], Any] = lambda at: at) -> dict[str, Any]:
        """The status as the API and ``distsched limit --json`` give it (``when`` formats times)."""
        override = None
        if self.override is not None:
            override = {
                "values": self.override,
                "by": self.override_by,
                "reason": self.override_reason,
                "until": when(self.override_until),
            }
        return {
            "name": self.name,
            "tasks": self.tasks,
            "queues": self.queues,
            "partition_by": self.partition_by,
            "fair": self.fair,
            "declared": self.declared,
            "override": override,
            "effective": self.effective,
            "in_use": self.in_use,
            "blocked": self.blocked,
            "throttled": self.throttled,
            "saturated_partitions": self.saturated_partitions,
            "top_partitions": self.top_partitions,
        }


def _numbers(numbers: rules.Numbers) -> dict[str, Any]:
    return {
        "concurrency": numbers.concurrency,
        "total": numbers.total,
        "rate": str(numbers.rate) if numbers.rate else None,
        "burst": numbers.burst,
        "local": numbers.local,
        "paused": numbers.paused,
    }


def _has_rate(spec: rules.LimitSpec, override: dict[str, Any] | None) -> bool:
    values = [spec.numbers.rate, *(v.get("rate") for v in spec.per_partition.values())]
    return any(values) or bool(override and override.get("rate"))


def status(now: datetime, name: str | None = None) -> list[LimitStatus]:
    """Every declared limit (or one): declared and effective numbers, the override in force, runs
    holding its slots, blocked and throttled runs, and the partitions with most waiting runs."""
    specs = [_spec(name)] if name is not None else list(rules.declared().values())
    rows = {row.name: row for row in Limit.objects.filter(name__in=[s.name for s in specs])}
    live = Q(run__state__in=list(LEASED_STATES), run__lease_expires_at__gt=now, run__attempts=F("attempt"))
    out = []
    for spec in specs:
        row = rows.get(spec.name)
        override = (
            row.override if row and row.override and (not row.override_until or row.override_until > now) else None
        )
        effective = spec.numbers_for("", override)
        held = dict(
            LimitHold.objects.filter(live, limit=spec.name)
            .order_by()
            .values_list("key")
            .annotate(n=Count("id"))
            .values_list("key", "n")
        )
        prefix = f"{limits.PREFIX}{spec.name}:"
        blocked: dict[str, int] = dict(
            Run.objects.filter(state=RunState.BLOCKED, held_by__startswith=prefix)  # the blocked runs' index
            .order_by()
            .values_list("held_by")
            .annotate(n=Count("id"))
            .values_list("held_by", "n")
        )
        blocked = {label[len(prefix) :]: n for label, n in blocked.items()}
        throttled = 0
        if _has_rate(spec, override):  # waiting runs a rate moved: a scan of waiting runs, only for rate limits
            throttled = Run.objects.filter(
                state__in=[RunState.PENDING, RunState.RETRYING], held_by__startswith=prefix, available_at__gt=now
            ).count()
        saturated = 0
        for key, n in held.items():
            cap = spec.numbers_for(key, override).concurrency
            if cap is not None and n >= cap:
                saturated += 1
        top = sorted(blocked.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_PARTITIONS]
        out.append(
            LimitStatus(
                name=spec.name,
                tasks=sorted(spec.tasks),
                queues=sorted(spec.queues),
                declared=_numbers(spec.numbers),
                override=override,
                override_by=row.override_by if override and row else "",
                override_reason=row.override_reason if override and row else "",
                override_until=row.override_until if override and row else None,
                effective=_numbers(effective),
                partition_by=list(spec.partition_by),
                fair=spec.fair,
                in_use=sum(held.values()),
                blocked=sum(blocked.values()),
                throttled=throttled,
                saturated_partitions=saturated,
                top_partitions=[{"partition": k, "blocked": n, "in_use": held.get(k, 0)} for k, n in top],
            )
        )
    return out
