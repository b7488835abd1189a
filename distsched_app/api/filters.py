"""Query-string filters of the list endpoints (django-filter).

An invalid value (an unknown state, say) is a 400 naming the parameter, not an
empty list: DjangoFilterBackend raises on an invalid filter form. So is an empty
one (``?state=``): HTML forms mean "any" by it, but it is not one of the values
the schema lists.
"""

from __future__ import annotations

import django_filters
from django import forms
from drf_spectacular.utils import extend_schema_field

from ..clock import current_clock
from ..models import MAX_PRIORITY, MIN_PRIORITY, Origin, Run, RunState, Schedule, ScheduleKind
from ..services import queries, run_search

BOOLEAN_CHOICES = [("true", "true"), ("false", "false")]
NO_NUL = "^[^\\u0000]*$"


def text_filter(description: str, **options) -> django_filters.CharFilter:
    """An exact-match text filter. Like every Django form field it refuses NUL characters (400),
    so its schema says so too."""
    schema = {"type": "string", "pattern": NO_NUL, "description": description}
    return extend_schema_field(schema)(django_filters.CharFilter(help_text=description, **options))


class StrictFilterForm(forms.Form):
    def clean(self):
        cleaned = super().clean()
        for name, field in self.fields.items():
            if self.data.get(name) != "":
                continue
            if isinstance(field, forms.ChoiceField):
                self.add_error(name, "Give one of the listed values, or leave the parameter out.")
            elif isinstance(field, forms.IntegerField):
                self.add_error(name, "Give a whole number, or leave the parameter out.")
        return cleaned


class IntegerFilter(django_filters.Filter):
    """An exact whole number (django-filter's NumberFilter takes decimals)."""

    field_class = forms.IntegerField


PRIORITY_HELP = "Only runs of this priority."
BOUND_HELP = (
    "Only runs scheduled for {} this time (ISO 8601 with offset). With a `kwargs__<key>=<value>` search "
    "and neither bound, the search covers the last {}."
)


def bound_filter(word: str) -> django_filters.CharFilter:
    text = BOUND_HELP.format(word, run_search.DEFAULT_WINDOW_TEXT)
    schema = {"type": "string", "format": "date-time", "description": text}
    return extend_schema_field(schema)(django_filters.CharFilter(method="bounded_below", help_text=text))


class RunFilter(django_filters.FilterSet):
    state = django_filters.ChoiceFilter(choices=RunState.choices, help_text="Only runs in this state.")
    schedule = text_filter(
        "Only runs of the schedule with this name (or, if no schedule has it, of a deleted schedule that had it).",
        method="filter_schedule",
    )
    task_name = text_filter("Only runs of this task.")
    queue = text_filter("Only runs on this queue.")
    origin = django_filters.ChoiceFilter(
        choices=Origin.choices, help_text="Only runs of this origin (enqueued: no schedule)."
    )
    priority = extend_schema_field(
        {"type": "integer", "minimum": MIN_PRIORITY, "maximum": MAX_PRIORITY, "description": PRIORITY_HELP}
    )(IntegerFilter(min_value=MIN_PRIORITY, max_value=MAX_PRIORITY, help_text=PRIORITY_HELP, method="filter_priority"))
    since = bound_filter("at or after")
    until = bound_filter("before")

    class Meta:
        model = Run
        form = StrictFilterForm
        fields = ["state", "schedule", "task_name", "queue", "origin", "priority", "since", "until"]

    def filter_schedule(self, queryset, name, value):
        return queryset.filter(queries.schedule_runs_q(value))

    def filter_priority(self, queryset, name, value):
        return queryset.filter(queries.priority_q(value))

    def bounded_below(self, queryset, name, value):
        return queryset  # since/until apply with the kwargs search, in filter_queryset

    def filter_queryset(self, queryset):
        """The declared filters, then the kwargs search (``kwargs__<key>=<json value>``) and the time
        bounds (``services.run_search``: a bad key or value is a 400 naming the parameter)."""
        queryset = super().filter_queryset(queryset)
        params = {name: value for name, value in self.data.items() if run_search.is_search_param(name)}
        return run_search.parse(params, now=current_clock().now()).apply(queryset)


class ScheduleFilter(django_filters.FilterSet):
    # A choice rather than a BooleanFilter: "paused=maybe" must be a 400, not "no filter".
    paused = django_filters.ChoiceFilter(
        choices=BOOLEAN_CHOICES, method="filter_paused", help_text="Only paused (true) or active (false) schedules."
    )
    kind = django_filters.ChoiceFilter(choices=ScheduleKind.choices, help_text="Only schedules of this kind.")
    task_name = text_filter("Only schedules of this task.")
    queue = text_filter("Only schedules on this queue.")

    class Meta:
        model = Schedule
        form = StrictFilterForm
        fields = ["paused", "kind", "task_name", "queue"]

    @extend_schema_field(
        {"type": "string", "enum": ["true", "false"], "description": "Only paused (true) or active (false) schedules."}
    )
    def filter_paused(self, queryset, name, value):
        return queryset.filter(paused=value == "true")
