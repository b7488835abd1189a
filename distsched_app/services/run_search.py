"""Search runs by their kwargs (``?kwargs__account_id=42``), time-bounded: the admin's run list and
``GET /api/runs`` read the query string through here.

- A parameter ``kwargs__<key>[__<key>...]`` matches runs whose ``kwargs`` hold that value at that
  key path (at most ``MAX_DEPTH`` keys). Each key is a name (letters, digits, ``_``; not starting
  with a digit, which JSON paths would read as a list index) and not one of the JSON field's lookup
  names (``contains``, ``exact``...), which Django would apply instead of reading the key.
- The value is compared **as JSON**: ``42`` matches the number 42 (not the text "42"), ``"42"``
  (quoted) the text, ``true``/``false`` the booleans; anything that is not JSON is text
  (``?kwargs__region=eu`` is ``"eu"``). Lists, objects and ``null`` are refused (equality of those
  differs between the databases), as are numbers beyond a 64-bit integer, non-finite ones, and
  unstorable text.
- The search is bounded in time on ``scheduled_for`` (its index): ``since``/``until`` (ISO 8601)
  when the request gives either, else the runs of the last ``DEFAULT_WINDOW`` among the newest
  ``DEFAULT_MAX_RUNS`` (a busy day holds millions). A JSON key is no index, so the
  bound is what keeps a search over a million runs fast. The comparison is Django's key transform
  (PostgreSQL ``(kwargs -> 'account_id') = '42'::jsonb``, SQLite ``json_extract``), so an
  expression index on one key that is searched often, the operator's choice (docs), serves it.
  (Containment, ``@>``, was measured slower without a GIN index: the planner then left the
  primary-key walk that finds the newest matches first.)

Bad input raises ``errors.ValidationError`` naming the parameter (400 in the API; the admin's
invalid-lookup page). Nothing here writes.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from django.db.models import F, JSONField, Max, Min, QuerySet
from django.db.models.fields.json import KeyTransform
from django.utils.dateparse import parse_datetime

from ..errors import ValidationError
from ..text import unstorable

PREFIX = "kwargs__"
BOUNDS = ("since", "until")
DEFAULT_WINDOW = timedelta(hours=24)
DEFAULT_WINDOW_TEXT = "24 hours"
"""A search with neither bound covers this much: a day of runs is what the page and its count read
(measured: over 7 days a rare value made the admin's count read ~230,000 runs at a million)."""
DEFAULT_MAX_RUNS = 50_000
"""...among this many runs, the newest (by id): a search's cost stays bounded at a million runs an hour
(~15-30 ms of JSON comparisons on PostgreSQL); ``since``/``until`` lift both limits."""
MAX_DEPTH = 4
MAX_TERMS = 5
MAX_VALUE = 500
KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")
BIGINT = 2**63 - 1
# A key named like one of these would be applied as a lookup, not read as a key.
RESERVED = frozenset(JSONField.get_lookups()) | frozenset(KeyTransform.get_lookups())


@dataclass(frozen=True, kw_only=True)
class KwargsSearch:
    """The kwargs criteria of one request and the time bounds applied with them."""

    terms: dict[str, Any]  # "account_id" or "customer__id" -> the JSON value to equal
    since: datetime | None
    until: datetime | None
    defaulted: bool  # the bounds are the default window (the request gave none)

    def apply(self, qs: QuerySet) -> QuerySet:
        if self.terms:
            qs = qs.filter(**{f"{PREFIX}{path}": value for path, value in self.terms.items()})
        if self.since is None and self.until is None:
            return qs
        manager = qs.model._default_manager.using(qs.db)
        if self.defaulted:
            # A busy day holds millions of runs, and a JSON key is no index: the default search reads the
            # newest DEFAULT_MAX_RUNS ids (the primary key's last entry, then its walk), keeping those of
            # the window. Reading the window's id range first would count its entries (1.3 million, 0.3 s).
            high = manager.aggregate(high=Max("id"))["high"]
            if high is None:
                return qs.none()
            return qs.filter(pk__gt=high - DEFAULT_MAX_RUNS, pk__lte=high, **_bounds(self.since, self.until))
        window = manager.filter(**_bounds(self.since, self.until))
        # The window's id range, read from the (scheduled_for, id) index alone: with it the newest-first
        # walk of the primary key stops at the window's oldest run. Without it, a value with fewer
        # matches than a page made PostgreSQL walk every run ever (measured: 1.1 s at a million).
        # "+ 0": a bare MIN(id) PostgreSQL rewrites into a walk of the primary key (measured: 0.44 s).
        ids = window.order_by().aggregate(low=Min(F("id") + 0), high=Max(F("id") + 0))
        if ids["low"] is None:
            return qs.none()
        return qs.filter(pk__gte=ids["low"], pk__lte=ids["high"], **_bounds(self.since, self.until))


def _bounds(since: datetime | None, until: datetime | None) -> dict[str, datetime]:
    found = {}
    if since is not None:
        found["scheduled_for__gte"] = since
    if until is not None:
        found["scheduled_for__lt"] = until
    return found


def is_search_param(name: str) -> bool:
    return name.startswith(PREFIX) or name in BOUNDS


def parse(params: Mapping[str, str], *, now: datetime) -> KwargsSearch:
    """The kwargs search the parameters ask for (no terms: an empty search that filters nothing)."""
    terms: dict[str, Any] = {}
    for name, raw in params.items():
        if name.startswith(PREFIX):
            terms[_path(name)] = _value(name, raw)
    if len(terms) > MAX_TERMS:
        raise ValidationError(f"at most {MAX_TERMS} kwargs__ parameters", field="kwargs")
    since, until = (_moment(name, params.get(name)) for name in BOUNDS)
    defaulted = bool(terms) and since is None and until is None
    if defaulted:
        since = now - DEFAULT_WINDOW
    return KwargsSearch(terms=terms, since=since, until=until, defaulted=defaulted)


def _path(name: str) -> str:
    keys = name[len(PREFIX) :].split("__")
    if len(keys) > MAX_DEPTH:
        raise ValidationError(f"{name}: at most {MAX_DEPTH} keys", field=name[:100])
    for key in keys:
        if not KEY_RE.fullmatch(key):
            raise ValidationError(
                f"{name[:100]}: a key is a name of letters, digits and '_' (not starting with a digit)",
                field=name[:100] if not unstorable(name) else "kwargs",
            )
        if key in RESERVED:
            raise ValidationError(f"{name}: {key!r} is a lookup name, not searchable as a key", field=name)
    return "__".join(keys)


def _value(name: str, raw: str) -> Any:
    if len(raw) > MAX_VALUE:
        raise ValidationError(f"{name}: the value is longer than {MAX_VALUE} characters", field=name)
    if (bad := unstorable(raw)) is not None:
        raise ValidationError(f"{name}: the value holds {bad}, which cannot be stored", field=name)
    try:
        value = json.loads(raw)
    except ValueError:
        return raw  # not JSON: text
    if isinstance(value, bool) or isinstance(value, str):
        if isinstance(value, str) and (bad := unstorable(value)) is not None:
            raise ValidationError(f"{name}: the value holds {bad}, which cannot be stored", field=name)
        return value
    if isinstance(value, int):
        if abs(value) > BIGINT:
            raise ValidationError(f"{name}: the number is beyond a 64-bit integer", field=name)
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValidationError(f"{name}: the number must be finite", field=name)
        return value
    raise ValidationError(f"{name}: give a number, true, false or text (not a list, object or null)", field=name)


def _moment(name: str, raw: str | None) -> datetime | None:
    if raw is None or raw == "":
        return None
    try:
        moment = parse_datetime(raw.strip()) if len(raw) <= 64 else None
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise ValidationError(f"{name}: give an ISO 8601 time with its offset, e.g. 2026-03-02T09:00:00Z", field=name)
    try:
        return moment.astimezone(timezone.utc)  # stored in UTC: 0001-01-01T00:00+05:00 has no UTC date
    except OverflowError:
        raise ValidationError(f"{name}: the time is out of range in UTC", field=name) from None
