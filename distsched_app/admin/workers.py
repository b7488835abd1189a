"""Workers in the admin: read-only, alive/stale/stopped and heartbeat age from one clock reading."""

from __future__ import annotations

from django.contrib import admin
from django.utils.html import format_html

from ..models import Run, Worker
from ..services import leader
from .display import age, change_url, timestamp_field
from .lists import WorkerLivenessFilter
from .mixins import DistschedMedia, StorableLookupsMixin
from .support import request_now


@admin.register(Worker)
class WorkerAdmin(DistschedMedia, StorableLookupsMixin, admin.ModelAdmin):
    list_filter = (WorkerLivenessFilter, "status")
    search_fields = ("worker_id", "hostname")
    list_per_page = 100
    fields_before = ("worker_id", "hostname", "pid", "queues", "capabilities_text", "status")
    fields_after = ("heartbeat_at_utc", "current_run_link", "runs_executed", "clock_skew_seconds", "started_at_utc")
    heartbeat_at_utc = timestamp_field("heartbeat_at", "last heartbeat (UTC)", ms=True)
    started_at_utc = timestamp_field("started_at", "started at (UTC)")

    def has_add_permission(self, request):
        return False  # workers register themselves

    def has_change_permission(self, request, obj=None):
        return False  # rows are written by the workers' heartbeats; deleting a stopped one is allowed

    def _clock_columns(self, request) -> tuple:
        """Columns that depend on "now": built per request around its one clock reading."""
        columns = getattr(request, "_distsched_worker_columns", None)
        if columns is None:
            now = request_now(request)

            @admin.display(description="liveness")
            def liveness(obj: Worker) -> str:
                label = obj.liveness(now)
                return format_html("<span class='distsched-live distsched-live-{}'>{}</span>", label, label)

            @admin.display(description="heartbeat age", ordering="-heartbeat_at")
            def heartbeat_age(obj: Worker) -> str:
                return age((now - obj.heartbeat_at).total_seconds())

            columns = (liveness, heartbeat_age)
            request._distsched_worker_columns = columns
        return columns

    def changelist_view(self, request, extra_context=None):
        """Who leads, above the list (a ``tick --loop`` leader has no worker row of its own)."""
        s = leader.status()
        if s.holder is None:
            line = "No leader: no `tick --loop` or `runworker --with-tick` process leads now."
        else:
            line = f"Leader: {s.holder} (host {s.host}, pid {s.pid}), term {s.term}."
        request._distsched_leader = s.holder
        return super().changelist_view(request, extra_context={**(extra_context or {}), "subtitle": line})

    def get_list_display(self, request):
        liveness, heartbeat_age = self._clock_columns(request)
        holder = getattr(request, "_distsched_leader", None)

        @admin.display(description="leader", boolean=True)
        def is_leader(obj: Worker) -> bool:
            return obj.worker_id == holder

        return (
            "worker_id",
            "hostname",
            "pid",
            "queues_text",
            "capabilities_text",
            "status",
            liveness,
            heartbeat_age,
            "current_run_link",
            "runs_executed",
            "started_at_utc",
            is_leader,
        )

    def get_fields(self, request, obj=None):
        return (*self.fields_before, *self._clock_columns(request), *self.fields_after)

    def get_readonly_fields(self, request, obj=None):
        return self.get_fields(request, obj)

    @admin.display(description="queues")
    def queues_text(self, obj: Worker) -> str:
        return ", ".join(obj.queues) if obj.queues else "all"

    @admin.display(description="capabilities")
    def capabilities_text(self, obj: Worker) -> str:
        return ", ".join(obj.capabilities) if obj.capabilities else "-"

    @admin.display(description="current run")
    def current_run_link(self, obj: Worker) -> str:
        if obj.current_run_id is None:
            return "-"
        return format_html("<a href='{}'>#{}</a>", change_url(Run, obj.current_run_id), obj.current_run_id)
