"""Bulk actions in the admin: the run list's "select all N" makes one (``from_changelist``), and
their pages show the filter, who asked and the progress, read-only.

When an operator ticks "Select all N runs" and picks cancel or requeue, the action does not load
the runs in the request: it hands the changelist's filter, as the URL states it, to
``services.bulk.create_bulk_action`` and links the job's page. The scope is exactly the filter: a
search term or a filter the bulk vocabulary cannot state refuses the action instead of acting on
something else. Reading the pages needs what reading runs needs; the **Stop** button of an
unfinished one, ``change_run``.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.utils.html import format_html

from ..errors import DistschedError
from ..models import UNFINISHED_BULK_STATES, BulkAction, BulkState
from ..services import bulk, run_filters
from .display import change_url, state_badge, timestamp_field
from .lists import parse_priority
from .mixins import DistschedMedia, ObjectActionsMixin, ReadOnlyAdminMixin
from .support import apply_each, changed_by, report_problems, request_now

# The run list's filter parameters that say the same as a bulk filter key, and those that only
# change how the list looks.
LIST_PARAMETERS = {"state", "schedule", "task_name", "queue", "origin", "priority", *run_filters.TIME_KEYS}
VIEW_PARAMETERS = {"o", "p", "_facets", "e"}


def changelist_filter(request: HttpRequest) -> tuple[dict[str, Any] | None, str]:
    """The bulk filter the run list's URL states, or (None, why not)."""
    found: dict[str, Any] = {}
    for key in request.GET:
        value = str(request.GET.get(key, ""))  # the last value, as the list filters read it
        if key in VIEW_PARAMETERS:
            continue
        if key == "q":
            if value.strip():
                return None, "a search cannot be applied to all matching runs: clear it, or select runs on this page"
            continue
        if key not in LIST_PARAMETERS:
            return None, f"the filter {key!r} cannot be applied to all matching runs"
        if key == "priority":
            number = parse_priority(value)
            if number is None:
                return None, "a priority band cannot be applied to all matching runs: filter by one priority"
            found[key] = number
        else:
            found[key] = value
    return found, ""


def from_changelist(modeladmin: Any, request: HttpRequest, action: str) -> None:
    """A job for every run the changelist's filter matches; reports it (or why not) to the user."""
    found, why_not = changelist_filter(request)
    if found is None:
        modeladmin.message_user(request, f"Nothing done: {why_not}.", messages.WARNING)
        return
    try:
        job = bulk.create_bulk_action(action=action, filter=found, now=request_now(request), **changed_by(request))
    except DistschedError as exc:
        modeladmin.message_user(request, f"Nothing done: {exc}", messages.WARNING)
        return
    modeladmin.message_user(
        request,
        format_html(
            "<a href='{}'>Bulk action {}</a>: {} the {} run(s) matching {}, in batches, in the background "
            "(the workers process it; its page shows the progress).",
            change_url(BulkAction, job.pk),
            job.pk,
            job.action,
            job.matched,
            run_filters.describe(job.filter),
        ),
        messages.SUCCESS,
    )


def readers(request: HttpRequest) -> bool:
    """Who may see bulk actions: whoever may see or act on runs (or has the model's view permission)."""
    user = request.user
    return any(user.has_perm(f"distsched_app.{perm}") for perm in ("view_bulkaction", "view_run", "change_run"))


@admin.register(BulkAction)
class BulkActionAdmin(DistschedMedia, ReadOnlyAdminMixin, ObjectActionsMixin, admin.ModelAdmin):
    list_display = ("id", "action", "filter_text", "state_badge", "progress", "actor", "created", "finished")
    list_display_links = ("id",)
    list_filter = ("state", "action")
    sortable_by = ("id",)
    list_per_page = 50
    object_actions = ("stop",)
    fields = (
        *("action", "filter_text", "state_badge", "progress", "matched", "done", "skipped", "batches"),
        *("actor", "source", "reason", "error", "max_run_id", "cursor"),
        *("created", "started", "finished", "updated", "lease_owner", "lease_expires"),
    )
    readonly_fields = fields
    created = timestamp_field("created_at", "created (UTC)")
    started = timestamp_field("started_at", "started (UTC)")
    finished = timestamp_field("finished_at", "finished (UTC)")
    updated = timestamp_field("updated_at", "updated (UTC)")
    lease_expires = timestamp_field("lease_expires_at", "lease expires (UTC)")

    def has_view_permission(self, request, obj=None):
        return readers(request)

    def has_module_permission(self, request):
        return readers(request)

    def has_operate_permission(self, request) -> bool:
        """May stop a bulk action: what making one needs (``change_run``)."""
        return request.user.has_perm("distsched_app.change_run")

    def change_view(self, request, object_id, form_url="", extra_context=None):
        job = self.get_object(request, object_id)
        stoppable = job is not None and job.state in UNFINISHED_BULK_STATES
        context = {"can_stop": stoppable and self.has_operate_permission(request), **(extra_context or {})}
        return super().change_view(request, object_id, form_url, context)

    def check_object_action(self, request, obj, name):
        if not self.has_operate_permission(request):
            raise PermissionDenied

    def stop_object(self, request, obj):
        now, by = request_now(request), changed_by(request)
        outcome = apply_each([obj.pk], lambda pk: bulk.stop_bulk_action(pk, now=now, **by))
        report_problems(self, request, outcome, verb="stopped", noun="bulk action")
        for job in outcome.done:
            self.message_user(
                request,
                f"Stopped bulk action {job.pk}; the {job.done} run(s) it {bulk.PAST[job.action]} stay so.",
                messages.SUCCESS,
            )

    @admin.display(description="filter")
    def filter_text(self, obj: BulkAction) -> str:
        return run_filters.describe(obj.filter)

    @admin.display(description="state")
    def state_badge(self, obj: BulkAction) -> str:
        return state_badge(obj.state)

    @admin.display(description="progress")
    def progress(self, obj: BulkAction) -> str:
        """``1,200 of 5,000 (24%), 3 skipped``, with a bar."""
        handled = obj.done + obj.skipped
        share = 100 if obj.state == BulkState.DONE or not obj.matched else min(100, 100 * handled // obj.matched)
        return format_html(
            "<progress max='100' value='{}'></progress> {} of {} ({}%), {} skipped",
            share,
            f"{obj.done:,}",
            f"{obj.matched:,}",
            share,
            f"{obj.skipped:,}",
        )
