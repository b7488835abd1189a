"""How the distsched admin shows values: UTC timestamps to the second, ages, state badges, links.

Pure formatting, no queries: every helper works from the row already loaded.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from django.contrib import admin
from django.db.models import Model
from django.urls import reverse
from django.utils.html import format_html

from ..durations import human_duration, short_unit, whole_units

duration = human_duration
"""A duration in the unit that fits its size (``850 µs``, ``12.3 ms``, ``4.21 s``, ``12 min 5 s``)."""


def change_url(model: type[Model], pk: Any) -> str:
    return reverse(f"admin:distsched_app_{model._meta.model_name}_change", args=[pk])


def pretty_json(value: Any) -> str:
    return format_html("<pre class='distsched-pre'>{}</pre>", json.dumps(value, indent=2, sort_keys=True))


def ts(moment: datetime | None, *, ms: bool = False) -> str:
    """UTC, to the second (or millisecond): the admin's default "March 2, 2026, 9 a.m." hides what matters."""
    if moment is None:
        return "-"
    text = moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    return f"{text}.{moment.microsecond // 1000:03d}" if ms else text


def timestamp_field(field: str, description: str, *, ms: bool = False):
    """A read-only column or field showing ``field`` with ``ts``."""

    @admin.display(description=description)
    def show(self, obj) -> str:
        return ts(getattr(obj, field), ms=ms)

    show.__name__ = f"{field}_utc"
    return show


def age(seconds: float) -> str:
    """A duration an operator reads at a glance: 45s, 12m 5s, 3h 4m, 2d 3h."""
    seconds = max(int(seconds), 0)
    if seconds < 120:
        return f"{seconds}s"
    big, big_unit, small, small_unit = whole_units(seconds, switch_at=2)
    return f"{big}{short_unit(big_unit)} {small}{short_unit(small_unit)}"


def state_badge(state: str) -> str:
    return format_html("<span class='distsched-state distsched-state-{}'>{}</span>", state, state)
