"""Limits in the admin: every declared limit with what holds and waits for it; a limit's page
with an override form, a reset button and the history of its overrides.

A thin adapter over ``services.limit_overrides``, imitating the paused-queues admin
(``admin.queues``). Limits are declared in ``DISTSCHED["LIMITS"]``, not stored: the ``Limit``
model only has rows for limits an operator overrode (or whose ``total`` admission locked), so
the list and the page are built from ``limit_overrides.status`` (every declared limit), never
from the table. The form sets an override (``set_override``), the button resets it
(``reset_override``), one call each; the actor recorded is ``user:<username>``. Changing needs
``change_limit``; reading, ``view_limit`` (or change). The history (``LimitEvent``) is read-only.
"""

from __future__ import annotations

import re
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from ..clock import iso_utc
from ..errors import DistschedError
from ..models import AuditSource, Limit
from ..services import limit_overrides
from ..services import limit_rules as rules
from ..services import queues as queue_service
from .display import ts
from .mixins import DistschedMedia
from .support import request_now

HISTORY_SHOWN = 20
NUMBER_FIELDS = rules.NUMBERS  # concurrency, total, rate, burst, local
DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def actor(request) -> str:
    return queue_service.user_actor(request.user.get_username())


def limit_url(name: str) -> str:
    """The limit's page (the admin's quoting: a limit name may hold "_")."""
    return reverse("admin:distsched_app_limit_change", args=[quote(name)])


def numbers_text(numbers: dict[str, Any] | None, *, full: bool = False) -> str:
    """``{"concurrency": 2, "rate": "5/s", ...}`` in one short line, unset numbers left out. ``full``:
    a limit's whole set of numbers (declared, effective), whose burst 1 is only the default."""
    if not numbers:
        return "-"
    parts = []
    for name in NUMBER_FIELDS:
        value = numbers.get(name)
        if value is None or (full and name == "burst" and (value == 1 or numbers.get("rate") is None)):
            continue
        parts.append(f"{name} {value}")
    if numbers.get("paused"):
        parts.append("paused")
    return ", ".join(parts) or "-"


def override_text(status: limit_overrides.LimitStatus) -> str:
    if status.override is None:
        return "-"
    until = f" until {ts(status.override_until)} UTC" if status.override_until else " until reset"
    return f"{numbers_text(status.override)} (by {status.override_by}{until})"


def partitions_text(status: limit_overrides.LimitStatus) -> str:
    if not status.top_partitions:
        return "-"
    return "; ".join(
        f"{p['partition']!r}: {p['blocked']} blocked, {p['in_use']} in use" if p["partition"] else
        f"(none): {p['blocked']} blocked, {p['in_use']} in use"
        for p in status.top_partitions
    )  # fmt: skip


def row(status: limit_overrides.LimitStatus) -> dict[str, Any]:
    applies = [*(f"task {t}" for t in status.tasks), *(f"queue {q}" for q in status.queues)]
    return {
        "status": status,
        "url": limit_url(status.name),
        "applies": ", ".join(applies),
        "declared": numbers_text(status.declared, full=True),
        "override": override_text(status),
        "effective": numbers_text(status.effective, full=True),
        "partitions": partitions_text(status),
        "partition_by": ", ".join(status.partition_by) or "-",
    }


def parse_duration(text: str) -> float:
    """``30m``, ``2h``, ``1d12h``, ``45s`` or a number of seconds; the service bounds it."""
    compact = text.strip().lower()
    try:
        return float(compact)
    except ValueError:
        pass
    parts = DURATION_RE.findall(compact)
    if not parts or "".join(n + u for n, u in parts) != compact:
        raise forms.ValidationError(f"{text!r} is not a duration: use e.g. 600, 45s, 30m, 2h or 1d12h")
    return sum(float(n) * UNITS[u] for n, u in parts)


class LimitOverrideForm(forms.Form):
    """An override's numbers (a blank one keeps the declared value), paused, why and for how long.
    Checked by the service (``limit_overrides.validate_override``), whose message the field shows."""

    concurrency = forms.IntegerField(required=False, help_text="Runs of one partition at a time (0 admits none).")
    total = forms.IntegerField(required=False, help_text="Runs of all partitions together (a limit with partition_by).")
    rate = forms.CharField(
        required=False, max_length=40, help_text="Starts per period per partition: 5/s, 100/m, 10/30s."
    )
    burst = forms.IntegerField(required=False, help_text="Starts a rate lets through at once (1: evenly spaced).")
    local = forms.IntegerField(required=False, help_text="Runs of the limit per worker.")
    paused = forms.BooleanField(required=False, help_text="Admit no run of the limit (running runs carry on).")
    reason = forms.CharField(
        required=False,
        max_length=queue_service.MAX_REASON,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text="Why, for whoever looks later (shown here, in the API and the CLI).",
    )
    duration = forms.CharField(
        required=False,
        max_length=40,
        help_text="How long it lasts: 600, 30m, 2h, 1d12h. Blank: until reset.",
    )

    def clean_duration(self) -> float | None:
        text = self.cleaned_data.get("duration") or ""
        return parse_duration(text) if text.strip() else None

    def override(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name in NUMBER_FIELDS:
            value = self.cleaned_data.get(name)
            if value is not None and value != "":
                values[name] = value.strip() if isinstance(value, str) else value
        if self.cleaned_data.get("paused"):
            values["paused"] = True
        return values

    @classmethod
    def initial_from(cls, status: limit_overrides.LimitStatus) -> dict[str, Any]:
        """The override in force, to edit (setting one replaces it)."""
        if status.override is None:
            return {}
        initial: dict[str, Any] = {k: v for k, v in status.override.items() if k in cls.base_fields and v is not None}
        initial["reason"] = status.override_reason
        return initial


@admin.register(Limit)
class LimitAdmin(DistschedMedia, admin.ModelAdmin):
    """The declared limits (not the ``Limit`` table): a list and a page per limit."""

    list_template = "admin/distsched_app/limit/change_list.html"
    page_template = "admin/distsched_app/limit/limit.html"

    def has_add_permission(self, request):
        return False  # limits are declared in DISTSCHED["LIMITS"]; an override is set on the limit's page

    def has_delete_permission(self, request, obj=None):
        return False  # a reset ends an override, with its history entry

    def has_operate_permission(self, request, obj=None) -> bool:
        """May override and reset limits: the model's change permission."""
        return request.user.has_perm(f"{self.opts.app_label}.change_{self.opts.model_name}")

    def get_urls(self):
        reset = path(
            "<path:object_id>/reset/",
            self.admin_site.admin_view(self.reset_view),
            name="distsched_app_limit_reset",
        )
        return [reset, *super().get_urls()]

    def _context(self, request, **extra: Any) -> dict[str, Any]:
        request.current_app = self.admin_site.name
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "now": request_now(request),
            "can_operate": self.has_operate_permission(request),
            **extra,
        }

    # -- the list: every declared limit

    def changelist_view(self, request, extra_context=None):
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        problem = rules.limits_problem()
        statuses = [] if problem else limit_overrides.status(request_now(request))
        context = self._context(
            request, title="Limits", problem=problem, rows=[row(s) for s in statuses], **(extra_context or {})
        )
        return TemplateResponse(request, self.list_template, context)

    # -- a limit's page: its status, the override form, the history

    def _status(self, request, name: str) -> limit_overrides.LimitStatus | None:
        try:
            [status] = limit_overrides.status(request_now(request), name=name)
        except DistschedError as exc:  # not declared (or DISTSCHED["LIMITS"] is malformed)
            self.message_user(request, str(exc), messages.WARNING)
            return None
        return status

    def change_view(self, request, object_id, form_url="", extra_context=None):
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        name = unquote(object_id)
        status = self._status(request, name)
        if status is None:
            return HttpResponseRedirect(reverse("admin:distsched_app_limit_changelist"))
        if request.method == "POST":
            if not self.has_operate_permission(request):
                raise PermissionDenied
            form = LimitOverrideForm(request.POST)
            if form.is_valid() and self._set(request, status.name, form):
                return HttpResponseRedirect(limit_url(status.name))
        else:
            form = LimitOverrideForm(initial=LimitOverrideForm.initial_from(status))
        context = self._context(
            request,
            title=f"Limit {status.name}",
            row=row(status),
            form=form,
            history=[
                {
                    "at": ts(e.created_at),
                    "action": e.action,
                    "actor": e.actor,
                    "override": numbers_text(e.override),
                    "until": ts(e.until),
                    "reason": e.reason or "-",
                }
                for e in limit_overrides.limit_events(status.name, limit=HISTORY_SHOWN)
            ],
            history_shown=HISTORY_SHOWN,
            reset_url=reverse("admin:distsched_app_limit_reset", args=[quote(status.name)]),
            **(extra_context or {}),
        )
        return TemplateResponse(request, self.page_template, context)

    def _set(self, request, name: str, form: LimitOverrideForm) -> bool:
        """``set_override`` with the form's values; its refusal goes on the field it names."""
        try:
            change = limit_overrides.set_override(
                name,
                form.override(),
                now=request_now(request),
                by=actor(request),
                reason=form.cleaned_data.get("reason") or "",
                for_seconds=form.cleaned_data.get("duration"),
                source=AuditSource.ADMIN,
            )
        except DistschedError as exc:
            target = {"for": "duration", "until": "duration"}.get(exc.field or "", exc.field)
            form.add_error(target if target in form.fields else None, str(exc))
            return False
        until = f" until {iso_utc(change.until)}" if change.until else " until reset"
        released = f"; {change.released} blocked run(s) let through" if change.released else ""
        self.message_user(
            request, f"Limit {name} overridden: {numbers_text(change.override)}{until}{released}.", messages.SUCCESS
        )
        return True

    # -- reset: the page's button

    def reset_view(self, request, object_id):
        """POST only: back to the declared numbers, then the limit's page."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_operate_permission(request):
            raise PermissionDenied
        name = unquote(object_id)
        status = self._status(request, name)
        if status is None:
            return HttpResponseRedirect(reverse("admin:distsched_app_limit_changelist"))
        if status.override is None:
            self.message_user(request, f"Limit {name} has no override: nothing changed.", messages.WARNING)
            return HttpResponseRedirect(limit_url(name))
        try:
            change = limit_overrides.reset_override(
                name, now=request_now(request), by=actor(request), source=AuditSource.ADMIN
            )
        except DistschedError as exc:
            self.message_user(request, f"Limit {name} not reset: {exc}", messages.WARNING)
        else:
            released = f"; {change.released} blocked run(s) let through" if change.released else ""
            self.message_user(request, f"Limit {name} reset to its declared numbers{released}.", messages.SUCCESS)
        return HttpResponseRedirect(limit_url(name))
