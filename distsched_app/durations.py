"""How a duration reads, in a unit that fits its size: the one helper the admin, the CLI's queue
figures and the docs' examples share.

``850 µs``, ``12.3 ms``, ``4.21 s``, ``42.5 s``, ``12 min 5 s``, ``3 h 4 min``, ``2 d 3 h``; ``-``
for an unknown duration. Three significant digits below a minute (a start lag of 4 ms and one of
4 s must not both read "0s"), whole units above (nobody reads 3 h to the millisecond).
"""

from __future__ import annotations

from datetime import timedelta


def human_duration(value: float | timedelta | None) -> str:
    """``value`` seconds (or a ``timedelta``) as text with its unit; negative values keep their sign."""
    if value is None:
        return "-"
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    if seconds < 0.001:
        return f"{sign}{seconds * 1_000_000:.0f} µs"
    if seconds < 1:
        return f"{sign}{_three_digits(seconds * 1000)} ms"
    if seconds < 60:
        return f"{sign}{_three_digits(seconds)} s"
    big, big_unit, small, small_unit = whole_units(int(seconds))
    return f"{sign}{big} {big_unit} {small} {small_unit}"


def whole_units(seconds: int, *, switch_at: int = 1) -> tuple[int, str, int, str]:
    """``seconds`` (a minute or more) in its two largest whole units: ``(12, "min", 5, "s")``,
    ``(3, "h", 4, "min")``, ``(2, "d", 3, "h")``. A unit is used from ``switch_at`` of it on
    (2: 90 min reads ``(90, "min", 0, "s")``). The ladder the admin, the CLI and ``human_duration`` share."""
    if seconds < 3600 * switch_at:
        return seconds // 60, "min", seconds % 60, "s"
    if seconds < 86400 * switch_at:
        return seconds // 3600, "h", seconds % 3600 // 60, "min"
    return seconds // 86400, "d", seconds % 86400 // 3600, "h"


def short_unit(unit: str) -> str:
    """The compact spelling of a ``whole_units`` unit (``min`` -> ``m``), for the CLI's and the admin's ages."""
    return "m" if unit == "min" else unit


def _three_digits(number: float) -> str:
    """1.23, 12.3, 123 (and 1000 -> "1000" when rounding carries over, never "1e+03")."""
    if number < 10:
        text = f"{number:.2f}"
    elif number < 100:
        text = f"{number:.1f}"
    else:
        text = f"{number:.0f}"
    return text
