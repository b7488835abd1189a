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
    whole = int(seconds)
    if whole < 3600:
        return f"{sign}{whole // 60} min {whole % 60} s"
    if whole < 86400:
        return f"{sign}{whole // 3600} h {whole % 3600 // 60} min"
    return f"{sign}{whole // 86400} d {whole % 86400 // 3600} h"


def _three_digits(number: float) -> str:
    """1.23, 12.3, 123 (and 1000 -> "1000" when rounding carries over, never "1e+03")."""
    if number < 10:
        text = f"{number:.2f}"
    elif number < 100:
        text = f"{number:.1f}"
    else:
        text = f"{number:.0f}"
    return text
