"""Costly operator figures, computed once and read by every scrape and page for a while.

Some figures grow with history or throughput however the query is written: the runs
counted over all time (succeeded ones at ten million rows), the events of the last hour
(a million an hour), the dashboard's 24 hours. ``memo(key, now, compute)`` computes a figure
and, when that took ``SLOW_SECONDS`` or more, stores it (``StoredFigure``, in the database,
so every web process reads the same); a reader then gets the stored figure while it is
younger than ``MAX_AGE_SECONDS`` and computes afresh after. The leader recomputes stored
figures older than ``REFRESH_AFTER_SECONDS`` (``refresh``, one per turn, the stalest first),
so with a ticker running no request pays for one. A figure that was fast (a small
installation, every test) is never stored: it is exact at every read, as before.

What a reader sees is the figure as of ``computed_at`` (at most ``MAX_AGE_SECONDS`` old):
the metrics' help and ``docs/reference/metrics.md`` say which ones.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db import IntegrityError, transaction

from ..models import StoredFigure

logger = logging.getLogger("distsched")

T = TypeVar("T")

SLOW_SECONDS = 0.05
"""A figure whose computation took this long or longer is stored (else computed at every read)."""
MAX_AGE_SECONDS = 30.0
"""A stored figure older than this is computed again by the reader that finds it."""
REFRESH_AFTER_SECONDS = 15.0
"""The leader recomputes a stored figure once it is this old: readers find it fresh."""

FORGET_AFTER = timedelta(days=3)
"""A stored figure nobody read again for this long is deleted (by ``refresh``): e.g. a closed hour's counts."""

_REGISTRY: dict[str, Callable[[datetime], Any]] = {}


def register(key: str, compute: Callable[[datetime], Any]) -> None:
    """Name a figure the leader may recompute (``refresh``): ``compute(now)``."""
    _REGISTRY[key] = compute


def memo(key: str, now: datetime, compute: Callable[[datetime], T], *, max_age: float | None = None) -> T:
    """The figure ``key``: the stored one if younger than ``max_age`` (``MAX_AGE_SECONDS``), else
    ``compute(now)`` (stored when it was slow, forgotten when it became fast)."""
    return memo_many(now, {key: compute}, max_age={key: max_age} if max_age is not None else None)[key]


def memo_many(
    now: datetime, computes: dict[str, Callable[[datetime], Any]], *, max_age: dict[str, float] | None = None
) -> dict[str, Any]:
    """Several figures (``memo``) for one lookup of the stored ones: a scrape reads three. ``max_age``:
    seconds per key, for figures that stay true longer (a closed hour's counts)."""
    rows = StoredFigure.objects.filter(key__in=list(computes)).values_list("key", "computed_at", "value")
    stored = set()
    values: dict[str, Any] = {}
    for key, computed_at, value in rows:
        stored.add(key)
        limit = (max_age or {}).get(key, MAX_AGE_SECONDS)
        if timedelta(0) <= now - computed_at < timedelta(seconds=limit):
            values[key] = pickle.loads(bytes(value))  # noqa: S301 - written by this module only
    for key, compute in computes.items():
        if key not in values:
            values[key] = _compute(key, now, compute, stored=key in stored)
    return values


def memo_batch(
    now: datetime, keys: list[str], compute_missing: Callable[[list[str]], dict[str, Any]], *, max_age: float
) -> dict[str, Any]:
    """Figures of one kind (a closed hour's counts each): the stored ones younger than ``max_age``,
    the others computed together by ``compute_missing(missing keys)`` (one query for them all) and
    each stored when that took ``SLOW_SECONDS`` or more."""
    values: dict[str, Any] = {}
    for key, computed_at, value in StoredFigure.objects.filter(key__in=keys).values_list("key", "computed_at", "value"):
        if timedelta(0) <= now - computed_at < timedelta(seconds=max_age):
            values[key] = pickle.loads(bytes(value))  # noqa: S301 - written by this module only
    missing = [key for key in keys if key not in values]
    if missing:
        started = time.monotonic()
        computed = compute_missing(missing)
        seconds = time.monotonic() - started
        if seconds >= SLOW_SECONDS:
            for key in missing:
                _store(key, now, seconds, computed[key])
        values.update(computed)
    return values


def _compute(key: str, now: datetime, compute: Callable[[datetime], T], *, stored: bool) -> T:
    started = time.monotonic()
    value = compute(now)
    seconds = time.monotonic() - started
    if seconds >= SLOW_SECONDS:
        _store(key, now, seconds, value)
    elif stored:
        StoredFigure.objects.filter(key=key).delete()  # cheap again: exact at every read from now on
    return value


def _store(key: str, now: datetime, seconds: float, value: Any) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    fields = {"computed_at": now, "seconds": seconds, "value": data}
    try:
        with transaction.atomic():
            updated = StoredFigure.objects.filter(key=key).update(**fields)
            if not updated:
                StoredFigure.objects.create(key=key, **fields)
    except IntegrityError:  # another process stored it first: its figure is as good
        pass


def refresh(now: datetime) -> str | None:
    """Recompute the stalest stored figure older than ``REFRESH_AFTER_SECONDS`` (the leader's chore,
    one per call so a turn's tick is delayed by one figure at most). Returns its key, or None."""
    StoredFigure.objects.filter(computed_at__lt=now - FORGET_AFTER).delete()  # figures no reader asks for now
    due = now - timedelta(seconds=REFRESH_AFTER_SECONDS)
    keys = StoredFigure.objects.filter(computed_at__lte=due, key__in=list(_REGISTRY)).order_by("computed_at")
    key = keys.values_list("key", flat=True).first()
    if key is None:
        return None
    _compute(key, now, _REGISTRY[key], stored=True)
    return key


def forget() -> None:
    """Drop every stored figure (tests; an operator after a restore)."""
    StoredFigure.objects.all().delete()
