"""The schedule list's health columns: a paused badge (with the pause's reason), last success, last
failure, consecutive failures and overdue, instead of Django's red-cross boolean.

``with_health`` annotates them in one query per page: each figure is a subquery along the
``(schedule, -id)`` run index (or the audit's ``(target_kind, target, -id)`` index for the pause
reason), so the page costs the same with a million runs. "Failure" is a run that ended dead
(out of attempts); consecutive failures are the dead runs since its last success.
"""

from __future__ import annotations

from datetime import datetime

from django.contrib import admin
from django.db.models import Count, Exists, OuterRef, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from ..conf import conf
from ..models import AuditAction, AuditEntry, AuditTarget, Run, RunState, Schedule
from .display import duration, ts


def with_health(qs: QuerySet, now: datetime) -> QuerySet:
    runs = Run.objects.filter(schedule=OuterRef("pk")).order_by("-id")
    succeeded = runs.filter(state=RunState.SUCCEEDED)
    dead = runs.filter(state=RunState.DEAD)
    since_success = (
        Run.objects.filter(
            schedule=OuterRef("pk"), state=RunState.DEAD, id__gt=Coalesce(OuterRef("last_success_id"), Value(0))
        )
        .order_by()
        .values("schedule")
        .annotate(n=Count("*"))
        .values("n")
    )
    pause = AuditEntry.objects.filter(
        target_kind=AuditTarget.SCHEDULE, target=OuterRef("name"), action=AuditAction.PAUSE
    ).order_by("-id")
    return qs.annotate(
        last_success_id=Subquery(succeeded.values("id")[:1]),
        last_success_at=Subquery(succeeded.values("finished_at")[:1]),
        last_failure_id=Subquery(dead.values("id")[:1]),
        last_failure_at=Subquery(dead.values("finished_at")[:1]),
        failures_in_a_row=Coalesce(Subquery(since_success[:1]), Value(0)),
        pause_reason=Subquery(pause.values("reason")[:1]),
        pause_by=Subquery(pause.values("actor")[:1]),
        is_overdue=Exists(Schedule.objects.overdue(now, conf.MISFIRE_GRACE_SECONDS).filter(pk=OuterRef("pk"))),
        overdue_since=Value(now),
    )


class ScheduleColumnsMixin:
    @admin.display(description="status", ordering="paused")
    def status(self, obj: Schedule) -> str:
        if obj.paused:
            reason = getattr(obj, "pause_reason", None) or ""
            by = getattr(obj, "pause_by", None) or ""
            title = " ".join(part for part in (f"by {by}" if by else "", f"“{reason}”" if reason else "") if part)
            text = format_html("<span class='distsched-badge distsched-badge-paused' title='{}'>paused</span>", title)
            if reason:
                return format_html("{} <span class='distsched-muted'>{}</span>", text, reason[:60])
            return text
        if getattr(obj, "is_overdue", False):
            late = duration(obj.overdue_since - obj.next_run_at)  # type: ignore[attr-defined]
            return format_html("<span class='distsched-badge distsched-badge-overdue'>overdue {}</span>", late)
        return mark_safe("<span class='distsched-badge distsched-badge-active'>active</span>")

    @admin.display(description="last success (UTC)", ordering="last_success_id")
    def last_success(self, obj: Schedule) -> str:
        return ts(getattr(obj, "last_success_at", None)) if getattr(obj, "last_success_id", None) else "-"

    @admin.display(description="last failure (UTC)", ordering="last_failure_id")
    def last_failure(self, obj: Schedule) -> str:
        return ts(getattr(obj, "last_failure_at", None)) if getattr(obj, "last_failure_id", None) else "-"

    @admin.display(description="failures in a row", ordering="failures_in_a_row")
    def failing(self, obj: Schedule) -> str:
        n = getattr(obj, "failures_in_a_row", 0) or 0
        if not n:
            return "0"
        return format_html("<span class='distsched-badge distsched-badge-failing'>{}</span>", n)
