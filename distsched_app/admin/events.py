"""Run history in the admin: the append-only event list and the inline on a run's page.

Events are written only by ``services.events``; here they are read-only
(no add, change or delete, not even for a superuser). The list stays fast on
a large table the way the runs list does: the same paginator, no full count,
no facet counts, sorting only by id.
"""

from __future__ import annotations

from django.contrib import admin
from django.db.models import Q
from django.utils.html import format_html

from ..models import Run, RunEvent
from .display import change_url, timestamp_field
from .lists import LargeTablePaginator, parse_id
from .mixins import DistschedMedia, ReadOnlyAdminMixin, StorableLookupsMixin


class RunEventInline(admin.TabularInline):
    """The run's history, oldest first; append-only, so read-only here."""

    model = RunEvent
    fields = ("at", "event_type", "attempt", "worker_id", "message")
    readonly_fields = fields
    at = timestamp_field("created_at", "at (UTC)", ms=True)
    ordering = ("id",)
    extra = 0
    max_num = 0
    can_delete = False
    verbose_name_plural = "history (events, oldest first)"

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(RunEvent)
class RunEventAdmin(DistschedMedia, ReadOnlyAdminMixin, StorableLookupsMixin, admin.ModelAdmin):
    list_display = ("id", "at", "run_link", "event_type", "attempt", "worker_id", "short_message")
    sortable_by = ("id",)
    list_filter = ("event_type",)
    search_fields = ("message",)  # see get_search_results
    search_help_text = "A run id, a worker id, or text from the message."
    ordering = ("-id",)
    list_per_page = 100
    paginator = LargeTablePaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    fields = ("id", "run_link", "event_type", "attempt", "worker_id", "message", "at")
    readonly_fields = fields
    at = timestamp_field("created_at", "at (UTC)", ms=True)

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        if (run_id := parse_id(term)) is not None:
            return queryset.filter(run_id=run_id), False
        return queryset.filter(Q(worker_id=term) | Q(message__icontains=term)), False

    @admin.display(description="run", ordering="run_id")
    def run_link(self, obj: RunEvent) -> str:
        return format_html("<a href='{}'>#{}</a>", change_url(Run, obj.run_id), obj.run_id)

    @admin.display(description="message")
    def short_message(self, obj: RunEvent) -> str:
        return obj.message if len(obj.message) <= 120 else obj.message[:117] + "..."
