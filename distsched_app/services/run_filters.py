"""A filter of runs as data: what a bulk action stores and applies again batch after batch.

The keys are the run list's (``GET /api/runs?state=dead&schedule=nightly``, the admin's
``?state=dead``), plus time bounds: ``state`` (one state or a list), ``schedule``,
``task_name``, ``queue``, ``origin``, ``priority`` and ``created_after``, ``created_before``,
``finished_after``, ``finished_before`` (ISO 8601 with an offset; after is inclusive, before
exclusive). ``clean`` checks one and returns it JSON-ready (what is stored and shown);
``to_q`` turns a clean one into a query. An unknown key or a bad value is a
``ValidationError`` naming it (``filter.<key>``), before anything is written.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from django.db.models import Q

from ..clock import iso_utc
from ..errors import ValidationError
from ..models import MAX_PRIORITY, MIN_PRIORITY, Origin, RunState
from ..text import unstorable
from . import queries
from .validation import bounded_int

TEXT_KEYS = {"schedule": "schedule__name", "task_name": "task_name", "queue": "queue"}
"""The text keys and their fields (``schedule`` is resolved to its id first: ``queries.schedule_runs_q``)."""
TIME_KEYS = {
    "created_after": "created_at__gte",
    "created_before": "created_at__lt",
    "finished_after": "finished_at__gte",
    "finished_before": "finished_at__lt",
}
KEYS = ("state", *TEXT_KEYS, "origin", "priority", *TIME_KEYS)
MAX_TEXT = 255


def _field(key: str) -> str:
    return f"filter.{key}"


def _states(value: Any) -> list[str]:
    values = value if isinstance(value, list) else [value]
    if not values or any(v not in RunState.values for v in values):
        raise ValidationError(
            f"state must be one of {', '.join(RunState.values)} (or a list of them)", field="filter.state"
        )
    return sorted(set(values), key=RunState.values.index)


def _text(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValidationError(f"{key} must be a non-empty string", field=_field(key))
    if len(value) > MAX_TEXT or unstorable(value) is not None:
        raise ValidationError(f"{key} is not a {key.replace('_', ' ')} any run can have", field=_field(key))
    return value


def _moment(key: str, value: Any) -> datetime:
    """An instant of any year (a bound compares, it never recurs): ISO 8601 with an offset."""
    try:
        when = datetime.fromisoformat(value) if isinstance(value, str) else None
        if when is not None and when.tzinfo is not None:
            return when.astimezone(timezone.utc)
    except (ValueError, OverflowError):
        pass
    raise ValidationError(f"{key} must be an ISO 8601 datetime with an offset", field=_field(key))


def clean(data: Any) -> dict[str, Any]:
    """The filter checked and normalised (states in their declared order, times in UTC)."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValidationError("filter must be an object of run filters", field="filter")
    unknown = sorted(str(k) for k in data if k not in KEYS)
    if unknown:
        raise ValidationError(
            f"unknown filter key(s) {', '.join(unknown)}; use {', '.join(KEYS)}", field=_field(unknown[0])
        )
    out: dict[str, Any] = {}
    for key in KEYS:
        if key not in data:
            continue
        value = data[key]
        if key == "state":
            states = _states(value)
            out[key] = states[0] if len(states) == 1 and not isinstance(value, list) else states
        elif key in TEXT_KEYS:
            out[key] = _text(key, value)
        elif key == "origin":
            if value not in Origin.values:
                raise ValidationError(f"origin must be one of {', '.join(Origin.values)}", field=_field(key))
            out[key] = value
        elif key == "priority":
            out[key] = bounded_int(value, field=_field(key), low=MIN_PRIORITY, high=MAX_PRIORITY)
        else:
            out[key] = iso_utc(_moment(key, value))
    return out


def to_q(cleaned: dict[str, Any]) -> Q:
    """The runs a clean filter matches, as a query (an empty filter: every run)."""
    q = Q()
    for key, value in cleaned.items():
        if key == "state":
            q &= Q(state__in=value) if isinstance(value, list) else Q(state=value)
        elif key == "schedule":
            q &= queries.schedule_runs_q(value)
        elif key in TEXT_KEYS:
            q &= Q(**{TEXT_KEYS[key]: value})
        elif key == "priority":
            q &= queries.priority_q(value)
        elif key == "origin":
            q &= Q(origin=value)
        else:
            q &= Q(**{TIME_KEYS[key]: _moment(key, value)})
    return q


def states_of(cleaned: dict[str, Any]) -> list[str] | None:
    """The states the filter names (None: any)."""
    value = cleaned.get("state")
    if value is None:
        return None
    return value if isinstance(value, list) else [value]


def describe(cleaned: dict[str, Any]) -> str:
    """``state=dead schedule=nightly`` (or ``all runs``): how messages and the admin name a filter."""
    if not cleaned:
        return "all runs"
    shown = ((k, cleaned[k]) for k in KEYS if k in cleaned)  # the vocabulary's order (a jsonb column keeps none)
    return " ".join(f"{k}={','.join(v) if isinstance(v, list) else v}" for k, v in shown)
