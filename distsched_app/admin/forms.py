"""The schedule add/change form: validated by the service layer's own validator.

``clean()`` runs ``services.validation`` (what ``create_schedule`` and
``update_schedule`` run before writing) and attaches each typed error to the
field it names. The admin then saves through the service, which computes
``next_run_at``; the form never writes and never decides a schedule rule.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import forms
from django.forms.fields import InvalidJSONInput, JSONString

from ..clock import current_clock
from ..conf import conf
from ..errors import DistschedError, InvalidPayload
from ..models import Schedule
from ..registry import registry
from ..services.audit import clean_reason
from ..services.schedules import UPDATABLE_FIELDS
from ..services.validation import decode_payload, validate_name, validate_schedule_fields
from ..text import storable

FORM_FIELDS = [
    "name",
    "task_name",
    "args",
    "kwargs",
    "kind",
    "interval_seconds",
    "cron",
    "timezone",
    "run_at",
    "start_at",
    "paused",
    "queue",
    "max_attempts",
    "retry_base_seconds",
    "retry_max_seconds",
    "retry_jitter",
    "catch_up",
    "overlap",
]


class StorableJSONFormField(forms.JSONField):
    """Decodes with the service's rule for typed payloads (``decode_payload``: a field error, where
    Django's field raises ``RecursionError`` for deep nesting and ``ValueError`` for a number of
    thousands of digits), and re-displays what the operator typed (even text the service refused)
    so it renders as UTF-8."""

    payload = "args"  # the field it decodes, named in its errors; ScheduleAdminForm sets it

    def to_python(self, value: Any) -> Any:
        if self.disabled or not isinstance(value, str) or value in self.empty_values:
            return super().to_python(value)
        try:
            converted = decode_payload(value, field=self.payload)
        except InvalidPayload as exc:
            raise forms.ValidationError(exc.message, code="invalid") from None
        return JSONString(converted) if isinstance(converted, str) else converted

    def bound_data(self, data: Any, initial: Any) -> Any:
        if self.disabled or not isinstance(data, str):
            return super().bound_data(data, initial)
        try:
            return decode_payload(data, field=self.payload)
        except InvalidPayload:
            return InvalidJSONInput(data)  # shown as typed

    def prepare_value(self, value: Any) -> Any:
        prepared = super().prepare_value(value)
        return storable(prepared) if isinstance(prepared, str) else prepared


class ScheduleAdminForm(forms.ModelForm):
    # The request's clock reading; ScheduleAdmin.get_form sets it on the form class it returns.
    now: datetime | None = None
    # Not model fields: why (kept in the schedule's history), and the version the form was read at,
    # so that saving over someone else's change since is refused instead of undoing it.
    reason = forms.CharField(
        required=False,
        max_length=1000,
        strip=False,
        widget=forms.TextInput(attrs={"size": 60}),
        help_text="Optional: why you change it, for whoever reads the History later.",
    )
    expected_version = forms.IntegerField(required=False, min_value=1, widget=forms.HiddenInput)

    class Meta:
        model = Schedule
        fields = FORM_FIELDS
        field_classes = {"args": StorableJSONFormField, "kwargs": StorableJSONFormField}
        help_texts = {
            "name": "A slug: letters, digits, '-' and '_'. Cannot be changed later.",
            "kind": "Optional: inferred from which of interval / cron / run at you fill in (fill exactly one).",
            "interval_seconds": "For interval schedules.",
            "cron": "For cron schedules: five fields, evaluated in the time zone below.",
            "timezone": "IANA name, e.g. Europe/Paris (cron schedules).",
            "run_at": "For one-off schedules (UTC).",
            "start_at": "Optional first slot of an interval or cron schedule (UTC).",
            "args": "JSON list of positional arguments.",
            "kwargs": "JSON object of keyword arguments.",
            "retry_base_seconds": "Backoff: min(base * 2**(attempt-1), max) seconds.",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        current = self.instance.task_name if self.instance.pk else ""
        names = sorted(set(registry.names()) | ({current} if current else set()))
        choices = [(n, n if n in registry else f"{n} (not registered)") for n in names]
        self.fields["task_name"] = forms.ChoiceField(
            choices=[("", "---------"), *choices], help_text="A task registered with @task."
        )
        self.fields["kind"].required = False
        for payload in ("args", "kwargs"):
            self.fields[payload].payload = payload  # type: ignore[attr-defined]  # a StorableJSONFormField
        if self.instance.pk:
            self.fields["name"].disabled = True
            self.initial.setdefault("expected_version", self.instance.version)
        else:
            # New schedules start from the project's DISTSCHED defaults, not the model's.
            self.initial.setdefault("max_attempts", conf.MAX_ATTEMPTS)
            self.initial.setdefault("retry_base_seconds", conf.RETRY_BASE_SECONDS)
            self.initial.setdefault("retry_max_seconds", conf.RETRY_MAX_SECONDS)
            self.initial.setdefault("catch_up", conf.CATCH_UP)

    @property
    def adding(self) -> bool:
        return self.instance.pk is None

    def service_fields(self) -> dict[str, Any]:
        """The whole schedule as the service layer takes it."""
        return {f: self.cleaned_data.get(f) for f in FORM_FIELDS if f in UPDATABLE_FIELDS}

    def changes(self) -> dict[str, Any]:
        """Only what the operator changed: ``update_schedule`` restarts ``next_run_at`` only when the
        recurrence changed, and re-checks ``run_at`` only when it is given."""
        fields = self.service_fields()
        return {f: fields[f] for f in self.changed_data if f in fields}

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if self.errors:
            return cleaned  # the service validator needs well-formed fields
        try:
            clean_reason(cleaned.get("reason"))
            if self.adding:
                validate_name(cleaned.get("name"))
            validate_schedule_fields(
                self.service_fields(),
                now=self.now or current_clock().now(),
                check_run_at=self.adding or "run_at" in self.changed_data,
            )
        except DistschedError as exc:
            self.add_error(exc.field if exc.field in self.fields else None, exc.message)
        return cleaned
