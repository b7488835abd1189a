"""Plain-text rendering for humans: aligned tables, key/value blocks, short times."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from typing import Any

from ...durations import short_unit, whole_units


def when(value: datetime | None) -> str:
    """UTC to the second, ``2026-03-02T09:00:00Z``; ``-`` when unset."""
    if value is None:
        return "-"
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def seconds(value: float | None) -> str:
    """A short human duration: ``0.57ms``, ``850ms``, ``4.2s``, ``3m05s``, ``2h10m``, ``3d04h``."""
    if value is None:
        return "-"
    sign = "-" if value < 0 else ""
    value = abs(value)
    if value < 1:
        return f"{sign}{value * 1000:.3g}ms"
    if value < 60:
        return f"{sign}{value:.1f}s"
    big, big_unit, small, small_unit = whole_units(int(value))
    return f"{sign}{big}{short_unit(big_unit)}{small:02d}{short_unit(small_unit)}"


def cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return when(value)
    text = str(value)
    # One row per record, whatever the data holds.
    return " ".join(text.split())


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, max_width: int = 60) -> str:
    """Columns padded to their widest cell; long cells are cut with an ellipsis."""
    body = [[_cut(cell(v), max_width) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in body:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in body]
    return "\n".join(lines)


def key_values(pairs: Sequence[tuple[str, Any]]) -> str:
    """``key: value`` lines with the values aligned."""
    width = max((len(k) for k, _ in pairs), default=0) + 1
    return "\n".join(f"{(k + ':').ljust(width)} {cell(v)}" for k, v in pairs)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
