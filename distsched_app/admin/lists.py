"""Changelist plumbing that stays fast on a million runs: a counting paginator and cheap list filters.

Django's stock filters would scan the runs table to offer choices
(``SELECT DISTINCT task_name FROM run``) or load every schedule into the
sidebar. These take their choices from the small tables (schedules, the
task registry, the state enum) and filter with plain indexed lookups. Their
parameters are named like the REST API's (``?state=dead&schedule=nightly``).
"""

from __future__ import annotations

from functools import cached_property

from django.contrib import admin
from django.core.paginator import Paginator
from django.db.models import Q, QuerySet

from ..db import server
from ..db.server import row_estimate
from ..models import MAX_PRIORITY, MIN_PRIORITY, Origin, RunState, Schedule
from ..registry import registry
from ..services import queries
from .support import request_now

MAX_ID = 2**63 - 1


def parse_id(term: str, *, marked: bool = False) -> int | None:
    """``"17"`` (or ``"#17"``; only ``"#17"`` when ``marked``) as a row id; None for anything else:
    digits ``int()`` refuses (``"²"``, ``"①"`` pass ``isdigit()``), other scripts' digits (``"٣"``),
    and numbers too big for a bigint column (PostgreSQL would refuse them with an error; past
    4,300 digits ``int()`` itself refuses). The caller then searches the term as text."""
    if term.startswith("#"):
        term = term[1:]
    elif marked:
        return None
    if not (term.isascii() and term.isdigit()) or len(term) > len(str(MAX_ID)) or int(term) > MAX_ID:
        return None
    return int(term)


def parse_priority(term: str) -> int | None:
    """``"5"``, ``"-20"`` as a priority; None for anything else, out of range included."""
    digits = term.removeprefix("-")
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 3:
        return None
    number = -int(digits) if term.startswith("-") else int(digits)
    return number if MIN_PRIORITY <= number <= MAX_PRIORITY else None


class LargeTablePaginator(Paginator):
    """Exact counts, except for lists of a big table on PostgreSQL.

    There the planner's row estimate (``pg_class.reltuples``, kept fresh by
    autovacuum) stands in for ``COUNT(*)`` of an unfiltered list, which would scan
    every row on every page view. A filtered list is counted up to
    ``filtered_exact_up_to`` rows (``COUNT(*)`` over a ``LIMIT``: its index stops the count
    early); beyond, the planner's estimate of the filter's rows stands in (at ten million
    runs, counting the 330,000 dead ones exactly took over a second). SQLite counts
    a million-row table from its smallest index in milliseconds: always exact.
    """

    estimate_above = 100_000
    filtered_exact_up_to = 10_000
    count_cap: int | None = None
    """Set for a list whose filter no index narrows (a kwargs search): count at most this many
    and one more (``COUNT(*)`` over a ``LIMIT``), so the count stops early instead of reading the
    whole time window; the page then says cap + 1 results."""

    @cached_property
    def count(self) -> int:
        qs = self.object_list
        if isinstance(qs, QuerySet) and self.count_cap is not None:
            return qs[: self.count_cap + 1].count()
        if isinstance(qs, QuerySet) and not qs.query.where:
            estimate = self._estimate(qs)
            if estimate is not None and estimate >= self.estimate_above:
                return estimate
        if isinstance(qs, QuerySet) and qs.query.where and server.counts_are_costly():
            capped = qs[: self.filtered_exact_up_to + 1].count()
            if capped <= self.filtered_exact_up_to:
                return capped
            return max(capped, server.query_estimate(qs) or 0)
        return qs.count() if isinstance(qs, QuerySet) else len(qs)

    @staticmethod
    def _estimate(qs: QuerySet) -> int | None:
        return row_estimate(qs.model, using=qs.db)


class ValueFilter(admin.SimpleListFilter):
    """Filter on one field with a plain equality; subclasses say where the choices come from."""

    field_name = ""

    def queryset(self, request, queryset):
        value = self.value()
        if value is None:
            return queryset
        return queryset.filter(**{self.field_name: value})

    def lookups(self, request, model_admin):
        choices = [(v, v) for v in self.values()]
        selected = self.value()
        if selected is not None and selected not in {v for v, _ in choices}:
            choices.append((selected, selected))  # a link from elsewhere may name a value not offered here
        return choices

    def values(self) -> list[str]:  # pragma: no cover - overridden
        return []


class StateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return RunState.choices

    def queryset(self, request, queryset):
        return queryset.filter(state=self.value()) if self.value() else queryset


class OriginFilter(admin.SimpleListFilter):
    title = "origin"
    parameter_name = "origin"

    def lookups(self, request, model_admin):
        return Origin.choices

    def queryset(self, request, queryset):
        return queryset.filter(origin=self.value()) if self.value() else queryset


class PriorityFilter(admin.SimpleListFilter):
    """Above, at or below the default priority (0); ``?priority=N`` (as in the API) for one value.

    A value that is no priority lists nothing, like an unknown schedule name.
    """

    title = "priority"
    parameter_name = "priority"
    bands = {
        # Off the default: with the (priority, -id) index's condition, which SQLite needs to use it.
        "high": ("above 0 (claimed first)", Q(priority__gt=0) & ~Q(priority=0)),
        "normal": ("0 (default)", Q(priority=0)),
        "low": ("below 0", Q(priority__lt=0) & ~Q(priority=0)),
    }

    def lookups(self, request, model_admin):
        choices = [(key, label) for key, (label, _) in self.bands.items()]
        selected = self.value()
        if selected is not None and selected not in self.bands:
            choices.append((selected, selected))
        return choices

    def queryset(self, request, queryset):
        value = self.value()
        if value is None:
            return queryset
        if value in self.bands:
            return queryset.filter(self.bands[value][1])
        number = parse_priority(value)
        return queryset.none() if number is None else queryset.filter(queries.priority_q(number))


class TaskFilter(ValueFilter):
    """Task names from the registry and the schedules (small), never from the runs table.

    The registry holds the tasks of Django's task framework too, under their module path.
    """

    title = "task"
    parameter_name = "task_name"
    field_name = "task_name"

    def values(self) -> list[str]:
        used = Schedule.objects.order_by().values_list("task_name", flat=True).distinct()
        return sorted(set(registry.names()) | set(used))


class QueueFilter(ValueFilter):
    title = "queue"
    parameter_name = "queue"
    field_name = "queue"

    def values(self) -> list[str]:
        """The schedules' queues, the queues framework tasks declare, and ``default``."""
        used = set(Schedule.objects.order_by().values_list("queue", flat=True).distinct())
        entries = (registry.find(name) for name in registry.names())
        declared = {e.framework_task.queue_name for e in entries if e is not None and e.framework_task is not None}
        return sorted(used | declared | {"default"})


class ScheduleFilter(ValueFilter):
    """By schedule name. Offers the first schedules by name, so the sidebar stays short with
    thousands of schedules; any schedule works through ``?schedule=<name>`` (its page links there)."""

    title = "schedule"
    parameter_name = "schedule"
    field_name = "schedule__name"
    offered = 30

    def queryset(self, request, queryset):
        value = self.value()
        return queryset if value is None else queryset.filter(queries.schedule_runs_q(value))

    def values(self) -> list[str]:
        return list(Schedule.objects.order_by("name").values_list("name", flat=True)[: self.offered])


class WorkerLivenessFilter(admin.SimpleListFilter):
    """alive / stale / stopped, with the model's QuerySet vocabulary and the request's clock reading."""

    title = "liveness"
    parameter_name = "liveness"

    def lookups(self, request, model_admin):
        return [("alive", "alive"), ("stale", "stale"), ("stopped", "stopped")]

    def queryset(self, request, queryset):
        value = self.value()
        if value == "alive":
            return queryset.alive(request_now(request))
        if value == "stale":
            return queryset.stale(request_now(request))
        if value == "stopped":
            return queryset.stopped()
        return queryset
