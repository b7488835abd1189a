"""The run list's time and error columns: started, duration, start lag, the last error's first line.

Started and scheduled-for sort through their ``(column, id)`` indexes (newest first by default,
then by id, as the admin adds ``-pk``), so a sorted page of a million runs reads 50 index entries.
Runs that never started sort after the newest started and before the oldest (``STARTED_ORDER``,
the order of the index ``distsched_run_started_desc``: SQLite's own, PostgreSQL's when told), so
newest started first no longer walks past every unstarted run before the first started one;
duration and start lag are shown, not sorted (an expression has no index). The error column reads
only the first ``ERROR_HEAD`` characters of ``last_error`` (annotated by ``with_error_head``), never
the traceback.
"""

from __future__ import annotations

from django.contrib import admin
from django.db.models import F, QuerySet
from django.db.models.functions import Left
from django.utils.html import format_html

from ..models import Run
from .display import duration, ts

ERROR_HEAD = 300

# Ascending: unstarted runs first; the admin reverses it for "-" (newest started first, unstarted last).
STARTED_ORDER = F("started_at").asc(nulls_first=True)


def with_error_head(qs: QuerySet) -> QuerySet:
    return qs.annotate(error_head=Left("last_error", ERROR_HEAD))


def first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


class RunColumnsMixin:
    @admin.display(description="scheduled for (UTC)", ordering="scheduled_for")
    def scheduled_col(self, obj: Run) -> str:
        return ts(obj.scheduled_for)

    @admin.display(description="started (UTC)", ordering=STARTED_ORDER)
    def started_col(self, obj: Run) -> str:
        return ts(obj.started_at)

    @admin.display(description="duration")
    def duration_col(self, obj: Run) -> str:
        if obj.started_at and obj.finished_at:
            return duration(obj.finished_at - obj.started_at)
        return "-"

    @admin.display(description="start lag")
    def lag_col(self, obj: Run) -> str:
        """How late its last attempt started after the time it was scheduled for."""
        if obj.started_at:
            return duration(obj.started_at - obj.scheduled_for)
        return "-"

    @admin.display(description="last error")
    def error_line(self, obj: Run) -> str:
        line = first_line(getattr(obj, "error_head", "") or "")
        if not line:
            return "-"
        return format_html("<span title='{}'>{}</span>", line, line[:120])
