"""Schedules in the admin: list, add/change through the service layer, pause/resume/trigger,
and the History page with its versions and "restore this version".

Saving calls ``create_schedule`` / ``update_schedule`` (which compute
``next_run_at``; the form carries the version it was read at, so saving over
someone else's change since is refused); deleting calls ``delete_schedule``
(the runs stay); the actions and the change page's buttons call
``pause_schedule``, ``resume_schedule`` and ``trigger_schedule`` once per
schedule; the History page lists ``services.audit``'s entries and its buttons
call ``restore_schedule``. Every change is recorded as ``user:<username>``,
source ``admin``.
"""

from __future__ import annotations

import json

from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.contrib.admin.views.main import PAGE_VAR
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef, Subquery
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.text import capfirst

from ..errors import DistschedError, ScheduleNotFound, ValidationError
from ..models import AuditAction, Run, Schedule, ScheduleKind
from ..services import audit
from ..services import schedules as schedule_service
from .display import change_url, state_badge, timestamp_field, ts
from .forms import ScheduleAdminForm
from .mixins import DistschedMedia, ObjectActionsMixin, StorableLookupsMixin
from .schedule_columns import ScheduleColumnsMixin, with_health
from .support import (
    apply_each,
    changed_by,
    operator,
    report_problems,
    request_now,
    selected_keys,
)

HISTORY_PER_PAGE = 100


class ServiceRejected(Exception):
    """A save the service refused after the form had validated (a race): nothing was written."""


@admin.register(Schedule)
class ScheduleAdmin(DistschedMedia, StorableLookupsMixin, ObjectActionsMixin, ScheduleColumnsMixin, admin.ModelAdmin):
    form = ScheduleAdminForm
    list_display = (
        "name",
        "task_name",
        "recurrence",
        "status",
        "next_run",
        "last_run",
        "last_success",
        "last_failure",
        "failing",
        "queue",
    )
    list_filter = ("paused", "kind", "queue", "task_name")  # the schedules table is small
    search_fields = ("name", "task_name")
    list_per_page = 100
    actions = ("pause_schedules", "resume_schedules", "trigger_schedules")
    object_actions = ("pause", "resume", "trigger")
    readonly_fields = (
        "version",
        "declared_in",
        "next_run_at_utc",
        "upcoming",
        "recent_runs",
        "created_at_utc",
        "updated_at_utc",
    )
    object_history_template = "admin/distsched_app/schedule/object_history.html"
    recent_runs_shown = 10
    next_run_at_utc = timestamp_field("next_run_at", "next run at (UTC)")
    created_at_utc = timestamp_field("created_at", "created at (UTC)")
    updated_at_utc = timestamp_field("updated_at", "updated at (UTC)")

    def get_fieldsets(self, request, obj=None):
        fieldsets = [
            (None, {"fields": ("name", "task_name", "args", "kwargs")}),
            ("When", {"fields": ("kind", "interval_seconds", "cron", "timezone", "run_at", "start_at", "paused")}),
            (
                "Execution",
                {
                    "fields": (
                        "queue",
                        "max_attempts",
                        "retry_base_seconds",
                        "retry_max_seconds",
                        "retry_jitter",
                        "catch_up",
                        "overlap",
                    )
                },
            ),
        ]
        change = ("reason", "expected_version") if obj is not None else ("reason",)
        fieldsets.append(("Why", {"fields": change}))
        if obj is not None:
            fieldsets.append(("Status", {"fields": self.readonly_fields}))
        return fieldsets

    def get_queryset(self, request):
        latest = Run.objects.filter(schedule=OuterRef("pk")).order_by("-id")
        qs = (
            super()
            .get_queryset(request)
            .annotate(
                last_run_id=Subquery(latest.values("id")[:1]),
                last_run_state=Subquery(latest.values("state")[:1]),
            )
        )
        return with_health(qs, request_now(request))

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)
        form.now = request_now(request)  # type: ignore[attr-defined]  # a ScheduleAdminForm subclass
        return form

    # -- list and detail columns

    @admin.display(description="recurrence")
    def recurrence(self, obj: Schedule) -> str:
        if obj.kind == ScheduleKind.INTERVAL:
            return f"every {obj.interval_seconds}s"
        if obj.kind == ScheduleKind.CRON:
            return f"{obj.cron} ({obj.timezone})"
        return f"once at {ts(obj.run_at)}" if obj.run_at else "once"

    @admin.display(description="next run (UTC)", ordering="next_run_at")
    def next_run(self, obj: Schedule) -> str:
        return ts(obj.next_run_at)

    @admin.display(description="last run", ordering="last_run_id")
    def last_run(self, obj: Schedule) -> str:
        last_run_id = getattr(obj, "last_run_id", None)  # annotated by get_queryset
        if last_run_id is None:
            return "-"
        return format_html(
            "<a href='{}'>#{}</a> {}",
            change_url(Run, last_run_id),
            last_run_id,
            state_badge(getattr(obj, "last_run_state", "")),
        )

    @admin.display(description="declared in code")
    def declared_in(self, obj: Schedule) -> str:
        if not obj.declared:
            return "no: made by hand"
        return (
            f"yes, in {obj.declared.get('source', 'settings')}: the next `schedule apply` (or ticker start) sets "
            "every field but paused back to the declaration"
        )

    @admin.display(description="next 5 fire times (UTC)")
    def upcoming(self, obj: Schedule) -> str:
        try:
            times = schedule_service.upcoming_fire_times(obj, 5)
        except ValidationError as exc:  # a stored recurrence the validation now refuses
            return f"none: {exc}"
        if not times:
            return "none: the schedule has no further slot"
        note = " (paused: no run is created until resumed)" if obj.paused else ""
        items = format_html_join("", "<li>{}</li>", ((ts(t),) for t in times))
        return format_html("<ol class='distsched-upcoming'>{}</ol>{}", items, note)

    @admin.display(description="recent runs")
    def recent_runs(self, obj: Schedule) -> str:
        recent = list(
            obj.runs.order_by("-id").only(
                "id", "state", "scheduled_for", "finished_at", "attempts", "origin", "schedule"
            )[: self.recent_runs_shown]
        )
        all_url = reverse("admin:distsched_app_run_changelist") + "?" + urlencode({"schedule": obj.name})
        if not recent:
            return "no runs yet"
        rows = format_html_join(
            "",
            "<tr><td><a href='{}'>#{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    change_url(Run, r.pk),
                    r.pk,
                    state_badge(r.state),
                    r.origin,
                    r.attempts,
                    ts(r.scheduled_for),
                    ts(r.finished_at),
                )
                for r in recent
            ),
        )
        return format_html(
            "<table class='distsched-runs'><thead><tr><th>run</th><th>state</th><th>origin</th><th>attempts</th>"
            "<th>scheduled for (UTC)</th><th>finished (UTC)</th></tr></thead><tbody>{}</tbody></table>"
            "<p><a href='{}'>All runs of this schedule</a></p>",
            rows,
            all_url,
        )

    # -- saving and deleting through the service layer

    def save_model(self, request, obj, form, change):
        now = request_now(request)
        by = changed_by(request, form.cleaned_data.get("reason") or "")
        try:
            if change:
                saved = schedule_service.update_schedule(
                    obj.name,
                    now=now,
                    expected_version=form.cleaned_data.get("expected_version"),
                    **by,
                    **form.changes(),
                )
            else:
                fields = form.service_fields()
                saved = schedule_service.create_schedule(
                    name=form.cleaned_data["name"], task_name=fields.pop("task_name"), now=now, **by, **fields
                )
        except DistschedError as exc:
            raise ServiceRejected(str(exc)) from exc
        for f in Schedule._meta.concrete_fields:
            setattr(obj, f.attname, getattr(saved, f.attname))
        obj._state.adding = False

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except ServiceRejected as exc:
            # Raised inside the admin's transaction, so it rolled back. Only a race gets here (the form
            # ran the service's validator): report it and reload the form.
            self.message_user(request, f"Not saved: {exc}", messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())

    def delete_model(self, request, obj):
        try:
            schedule_service.delete_schedule(obj.name, now=request_now(request), **changed_by(request))
        except ScheduleNotFound:
            pass  # already gone

    def delete_queryset(self, request, queryset):
        for name in queryset.values_list("name", flat=True):
            self.delete_model(request, Schedule(name=name))

    def get_deleted_objects(self, objs, request):
        """Summarise instead of listing: a schedule may own a million runs, and the stock
        confirmation page would load every run and event to print them."""
        objs = list(objs)
        listed = [f"Schedule: {o}" for o in objs]
        # The runs are kept (their waiting ones cancelled), so they are not listed as deleted.
        return listed, {"schedules": len(objs)}, set(), []

    # -- actions: one service call per schedule

    def _apply(self, request, keys, service, *, verb: str):
        now, by = request_now(request), changed_by(request)
        outcome = apply_each(keys, lambda name: service(name, now=now, **by))
        if outcome.done:
            self.message_user(request, f"{verb.capitalize()} {len(outcome.done)} schedule(s).", messages.SUCCESS)
        report_problems(self, request, outcome, verb=verb, noun="schedule")
        return outcome

    @admin.action(description="Pause selected schedules", permissions=["change"])
    def pause_schedules(self, request, queryset):
        if (keys := selected_keys(self, request, queryset, "name")) is not None:
            self._apply(request, keys, schedule_service.pause_schedule, verb="paused")

    @admin.action(description="Resume selected schedules", permissions=["change"])
    def resume_schedules(self, request, queryset):
        if (keys := selected_keys(self, request, queryset, "name")) is not None:
            self._apply(request, keys, schedule_service.resume_schedule, verb="resumed")

    @admin.action(description="Trigger selected schedules now (one manual run each)", permissions=["change"])
    def trigger_schedules(self, request, queryset):
        if (keys := selected_keys(self, request, queryset, "name")) is not None:
            self._trigger(request, keys)

    def _trigger(self, request, keys):
        now, by = request_now(request), changed_by(request)
        message = f"triggered by {operator(request)}"
        outcome = apply_each(keys, lambda name: schedule_service.trigger_schedule(name, now=now, message=message, **by))
        if outcome.done:
            links = format_html_join(
                ", ", "<a href='{}'>#{}</a>", ((change_url(Run, r.pk), r.pk) for r in outcome.done)
            )
            self.message_user(
                request, format_html("Triggered {} schedule(s): run {}.", len(outcome.done), links), messages.SUCCESS
            )
        report_problems(self, request, outcome, verb="triggered", noun="schedule")

    def check_object_action(self, request, obj, name):
        if not self.has_change_permission(request, obj):
            raise PermissionDenied

    def pause_object(self, request, obj):
        self._apply(request, [obj.name], schedule_service.pause_schedule, verb="paused")

    def resume_object(self, request, obj):
        self._apply(request, [obj.name], schedule_service.resume_schedule, verb="resumed")

    def trigger_object(self, request, obj):
        self._trigger(request, [obj.name])

    # -- the History page: versions and actions, restore

    def get_urls(self):
        info = self.opts.app_label, self.opts.model_name
        restore = path(
            "<path:object_id>/history/restore/",
            self.admin_site.admin_view(self.restore_view),
            name="{}_{}_restore".format(*info),
        )
        return [restore, *super().get_urls()]

    def history_view(self, request, object_id, extra_context=None):
        """The schedule's versions and actions from the audit trail (not the admin's LogEntry,
        which misses every change made outside the admin), newest first."""
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        if not self.has_view_or_change_permission(request, obj):
            raise PermissionDenied
        paginator = self.get_paginator(request, audit.schedule_history(obj.name), HISTORY_PER_PAGE)
        page = paginator.get_page(request.GET.get(PAGE_VAR, 1))
        context = {
            **self.admin_site.each_context(request),
            "title": f"History: {obj}",
            "subtitle": None,
            "object": obj,
            "opts": self.opts,
            "module_name": str(capfirst(self.opts.verbose_name_plural)),
            "page": page,
            "rows": [self._history_row(entry, obj) for entry in page],
            "page_range": paginator.get_elided_page_range(page.number),
            "page_var": PAGE_VAR,
            "pagination_required": paginator.count > HISTORY_PER_PAGE,
            "can_restore": self.has_change_permission(request, obj),
            "restore_url": reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_restore", args=[quote(obj.pk)]),
            "preserved_filters": self.get_preserved_filters(request),
            **(extra_context or {}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, self.object_history_template, context)

    @staticmethod
    def _history_row(entry, obj: Schedule) -> dict:
        return {
            "version": entry.version,
            "at": ts(entry.created_at),
            "action": entry.action,
            "actor": entry.actor,
            "source": entry.source,
            "reason": entry.reason,
            "what": audit.describe(entry),
            "snapshot": json.dumps(entry.snapshot, indent=2, ensure_ascii=False) if entry.snapshot else "",
            # Any version with a configuration but the one in force; a trigger makes none.
            "restorable": bool(entry.snapshot)
            and entry.action != AuditAction.TRIGGER
            and entry.version is not None
            and entry.version != obj.version,
        }

    def restore_view(self, request, object_id):
        """POST only: restore the version the button names, then back to the History page."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        if not self.has_change_permission(request, obj):
            raise PermissionDenied
        history = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_history", args=[quote(obj.pk)])
        version, expected = _whole(request.POST.get("version")), _whole(request.POST.get("expected_version"))
        if version is None:
            self.message_user(request, "Not restored: no version given.", messages.ERROR)
            return HttpResponseRedirect(history)
        try:
            restored = schedule_service.restore_schedule(
                obj.name, version, now=request_now(request), expected_version=expected, **changed_by(request)
            )
        except DistschedError as exc:
            self.message_user(request, f"Not restored: {exc}", messages.WARNING)
        else:
            self.message_user(
                request,
                f"Restored version {version} of {obj.name}: it is now version {restored.version}.",
                messages.SUCCESS,
            )
        return HttpResponseRedirect(history)


def _whole(text: str | None) -> int | None:
    """A form's whole number, or None when it is not one."""
    if text is None or not (text.isascii() and text.isdigit()) or len(text) > 9:
        return None
    return int(text)
