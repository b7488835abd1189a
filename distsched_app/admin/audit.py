"""The audit log in the admin: every schedule change (its versions) and every other operator
action (runs cancelled and requeued, queues paused and resumed, limits overridden), read-only.

Written only by ``services.audit``, inside the transaction of each change; here nothing can be
added, changed or deleted, not even by a superuser. A schedule's own page links its entries
from its History page.
"""

from __future__ import annotations

from django.contrib import admin

from ..models import AuditEntry
from ..services import audit
from .display import timestamp_field
from .lists import LargeTablePaginator
from .mixins import DistschedMedia, ReadOnlyAdminMixin, StorableLookupsMixin


@admin.register(AuditEntry)
class AuditEntryAdmin(DistschedMedia, ReadOnlyAdminMixin, StorableLookupsMixin, admin.ModelAdmin):
    list_display = ("id", "at", "target_kind", "target", "version", "action", "actor", "source", "reason", "what")
    list_display_links = ("id",)
    list_filter = ("target_kind", "action", "source")
    search_fields = ("=target", "actor")
    search_help_text = "A schedule, queue or limit name or a run id (exactly), or who acted."
    sortable_by = ("id",)
    paginator = LargeTablePaginator
    show_full_result_count = False
    list_per_page = 100
    fields = (
        *("at", "target_kind", "target", "schedule_id", "version", "action", "actor", "source", "reason"),
        *("changes", "snapshot", "data"),
    )
    readonly_fields = fields
    at = timestamp_field("created_at", "at (UTC)")

    @admin.display(description="what")
    def what(self, obj: AuditEntry) -> str:
        return (
            audit.describe(obj)
            if obj.target_kind == "schedule"
            else ", ".join(f"{k}: {v}" for k, v in (obj.data or {}).items() if v not in (None, "", 0)) or "-"
        )
