"""Paused queues in the admin: the list (who, when, why), a pause form, resume, and the history.

A thin adapter over ``services.queues``: the add form pauses (``pause_queue``),
the list's action and the page's button resume (``resume_queue``), one call per
queue. Pauses are never edited or deleted by hand (a resume is what removes
one, with its history entry and the workers' wake-up). The actor recorded is
``user:<username>``. Pausing and resuming need ``change_queuepause``; reading,
``view_queuepause`` (or change). The history (``QueueEvent``) is read-only.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from ..errors import DistschedError
from ..models import AuditSource, QueueEvent, QueuePause
from ..services import queues as queue_service
from ..services.validation import validate_queue
from . import queue_pages
from .display import timestamp_field, ts
from .mixins import DistschedMedia, ReadOnlyAdminMixin, StorableLookupsMixin
from .support import apply_each, report_problems, request_now, selected_keys

HISTORY_SHOWN = 20


def actor(request) -> str:
    return queue_service.user_actor(request.user.get_username())


class QueuePauseForm(forms.ModelForm):
    """Pause a queue: its name checked by the service's validator, a reason for whoever looks later."""

    class Meta:
        model = QueuePause
        fields = ["queue", "reason"]
        help_texts = {
            "queue": "Letters, digits, '.', '-' and '_'. Its runs are not claimed until it is resumed; "
            "runs already running carry on.",
            "reason": "Why, for whoever looks later (shown in the list, the API and the CLI).",
        }

    def clean_queue(self) -> str:
        try:
            queue = validate_queue(self.cleaned_data.get("queue"))
        except DistschedError as exc:
            raise forms.ValidationError(str(exc)) from None
        pause = queue_service.pause_of(queue)
        if pause is not None:
            raise forms.ValidationError(
                f"queue {queue} is already paused, by {pause.paused_by} at {ts(pause.paused_at)}"
            )
        return queue

    def validate_unique(self) -> None:
        pass  # clean_queue says who holds the pause; the service decides a race


@admin.register(QueuePause)
class QueuePauseAdmin(DistschedMedia, StorableLookupsMixin, admin.ModelAdmin):
    form = QueuePauseForm
    list_display = ("queue", "paused_by", "paused_at_utc", "reason")
    search_fields = ("queue", "paused_by", "reason")
    list_per_page = 100
    actions = ("resume_queues",)
    paused_at_utc = timestamp_field("paused_at", "paused at (UTC)")

    def has_add_permission(self, request):
        return self.has_operate_permission(request)  # adding a pause is pausing the queue

    def has_change_permission(self, request, obj=None):
        return False  # the page is a view: a pause changes only by resume and pause again

    def has_delete_permission(self, request, obj=None):
        return False  # a resume removes it, with its history entry and the workers' wake-up

    def has_operate_permission(self, request, obj=None) -> bool:
        """May pause and resume queues: the model's change permission."""
        return request.user.has_perm(f"{self.opts.app_label}.change_{self.opts.model_name}")

    def get_fields(self, request, obj=None):
        return ("queue", "reason") if obj is None else ("queue", "paused_by", "paused_at_utc", "reason", "history")

    def get_readonly_fields(self, request, obj=None):
        return () if obj is None else self.get_fields(request, obj)

    @admin.display(description=f"history (newest first, last {HISTORY_SHOWN})")
    def history(self, obj: QueuePause) -> str:
        return history_table(queue_service.queue_events(obj.queue, limit=HISTORY_SHOWN))

    # -- pausing: the add form, through the service

    def save_model(self, request, obj, form, change):
        done = queue_service.pause_queue(
            form.cleaned_data["queue"],
            now=request_now(request),
            by=actor(request),
            reason=form.cleaned_data["reason"],
            source=AuditSource.ADMIN,
        )
        pause = done.pause or obj
        for f in QueuePause._meta.concrete_fields:
            setattr(obj, f.attname, getattr(pause, f.attname))
        obj._state.adding = False
        request._distsched_pause = done  # read by response_add

    def response_add(self, request, obj, post_url_continue=None):
        done = getattr(request, "_distsched_pause", None)
        if done is not None and not done.changed:  # another operator paused it in between
            self.message_user(
                request, f"Queue {obj.queue} was already paused by {obj.paused_by}: nothing changed.", messages.WARNING
            )
        else:
            self.message_user(
                request, f"Paused queue {obj.queue}: its runs are not claimed until it is resumed.", messages.SUCCESS
            )
        return HttpResponseRedirect(reverse("admin:distsched_app_queuepause_changelist"))

    # -- resuming: the action and the page's button, one service call per queue

    def _resume(self, request, names) -> None:
        now, by = request_now(request), actor(request)
        outcome = apply_each(
            names, lambda name: queue_service.resume_queue(name, now=now, by=by, source=AuditSource.ADMIN)
        )
        resumed = [c.queue for c in outcome.done if c.changed]
        if resumed:
            self.message_user(request, f"Resumed {len(resumed)} queue(s): {', '.join(resumed)}.", messages.SUCCESS)
        if len(resumed) < len(outcome.done):
            self.message_user(
                request, f"{len(outcome.done) - len(resumed)} queue(s) were no longer paused.", messages.WARNING
            )
        report_problems(self, request, outcome, verb="resumed", noun="queue")

    @admin.action(description="Resume selected queues", permissions=["operate"])
    def resume_queues(self, request, queryset):
        if (keys := selected_keys(self, request, queryset, "queue")) is not None:
            self._resume(request, keys)

    def get_urls(self):
        resume = path(
            "<path:object_id>/resume/",
            self.admin_site.admin_view(self.resume_view),
            name="distsched_app_queuepause_resume",
        )
        view = self.admin_site.admin_view
        pages = [
            path("queues/", view(self.queues_view), name="distsched_queues"),
            path("queues/<str:name>/pause/", view(self.queue_pause_view), name="distsched_queue_pause"),
            path("queues/<str:name>/resume/", view(self.queue_resume_view), name="distsched_queue_resume"),
            path("queues/<str:name>/", view(self.queue_view), name="distsched_queue"),
        ]
        return [*pages, resume, *super().get_urls()]

    # -- the queues page (queue_pages): figures per queue, pause with a reason, resume

    def queues_view(self, request):
        return queue_pages.list_view(self, request)

    def queue_view(self, request, name):
        return queue_pages.detail_view(self, request, unquote(name))

    def queue_pause_view(self, request, name):
        return queue_pages.change_view(self, request, unquote(name), pause=True)

    def queue_resume_view(self, request, name):
        return queue_pages.change_view(self, request, unquote(name), pause=False)

    def resume_view(self, request, object_id):
        """The pause page's button (POST only): resume, then the list (the pause is gone)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_operate_permission(request):
            raise PermissionDenied
        self._resume(request, [unquote(object_id)])
        return HttpResponseRedirect(reverse("admin:distsched_app_queuepause_changelist"))

    def change_view(self, request, object_id, form_url="", extra_context=None):
        context = {"can_operate": self.has_operate_permission(request), **(extra_context or {})}
        return super().change_view(request, object_id, form_url, context)


def history_table(entries: list[QueueEvent]) -> str:
    if not entries:
        return "-"
    rows = format_html_join(
        "",
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        ((ts(e.created_at), e.action, e.actor, e.reason or "-") for e in entries),
    )
    return format_html(
        "<table class='distsched-runs'><thead><tr><th>at (UTC)</th><th>action</th><th>by</th><th>reason</th>"
        "</tr></thead><tbody>{}</tbody></table>",
        rows,
    )


@admin.register(QueueEvent)
class QueueEventAdmin(DistschedMedia, ReadOnlyAdminMixin, StorableLookupsMixin, admin.ModelAdmin):
    """Every pause and resume, newest first: who paused a queue and why, also after the resume."""

    list_display = ("created_at_utc", "queue", "action", "actor", "reason")
    list_filter = ("action",)
    search_fields = ("queue", "actor", "reason")
    list_per_page = 100
    sortable_by = ()  # newest first, always
    fields = ("queue", "action", "actor", "reason", "created_at_utc")
    readonly_fields = fields
    created_at_utc = timestamp_field("created_at", "at (UTC)")
