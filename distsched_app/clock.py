"""Time, injected: the only place that reads the real clock.

Services, the tick and the worker take a ``Clock`` (or ``now``) and call
``now()`` once per operation; tests pass a ``FakeClock`` and move time by hand.
Adapters (API, admin, metrics, commands) have no constructor to take a clock
through, so they all read ``current_clock()``: the system clock, unless a test
installed another with ``use_clock()``. One accessor, one thing to fake.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Protocol, runtime_checkable

from django.utils import timezone as dj_timezone


@runtime_checkable
class Clock(Protocol):
    def now(self) -> datetime:
        """The current instant, timezone-aware, in UTC."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> datetime:
        return dj_timezone.now()


def _parse(value: datetime | str) -> datetime:
    dt = datetime.fromisoformat(value) if isinstance(value, str) else value
    if dt.tzinfo is None:
        raise ValueError("FakeClock needs timezone-aware datetimes")
    return dt.astimezone(timezone.utc)


class FakeClock:
    """A clock that only moves when told to. Thread-safe."""

    def __init__(self, start: datetime | str = "2026-01-01T00:00:00+00:00") -> None:
        self._now = _parse(start)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def set(self, value: datetime | str) -> datetime:
        with self._lock:
            self._now = _parse(value)
            return self._now

    def advance(self, seconds: float = 0, **kwargs: float) -> datetime:
        """Move forward by ``seconds`` (and/or ``minutes=``, ``hours=``, ``days=``)."""
        with self._lock:
            self._now = self._now + timedelta(seconds=seconds, **kwargs)
            return self._now


system_clock = SystemClock()
_installed: Clock | None = None


def current_clock() -> Clock:
    """The clock every adapter and command reads: the system clock unless ``use_clock`` installed one."""
    return _installed or system_clock


@contextmanager
def use_clock(clock: Clock) -> Iterator[Clock]:
    """Make ``current_clock()`` return ``clock`` inside the block (tests: a ``FakeClock``)."""
    global _installed
    previous, _installed = _installed, clock
    try:
        yield clock
    finally:
        _installed = previous


def iso_utc(moment: datetime) -> str:
    """The one text form of an instant: ISO 8601 in UTC with ``Z`` (``2026-03-02T09:00:00Z``),
    as the REST API writes it, so API, CLI ``--json``, stats and messages agree."""
    return moment.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
