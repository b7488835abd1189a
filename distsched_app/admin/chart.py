"""Geometry of the dashboard's throughput chart: a stacked bar per hour, drawn as inline SVG.

Pure: hourly counts in, rectangles and labels out. The template only places
them, so the chart needs no JavaScript and no external asset, and tests can
check the numbers without parsing SVG.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from ..services.stats import OUTCOMES, HourOutcomes

# Outcome -> CSS class and legend colour (the template styles the classes).
COLOURS: dict[str, str] = {
    "succeeded": "#3b8a3e",
    "retried": "#e0a100",
    "dead": "#c0392b",
    "cancelled": "#7f8c8d",
}


@dataclass(frozen=True, kw_only=True)
class Segment:
    outcome: str
    count: int
    x: float
    y: float
    width: float
    height: float
    colour: str
    title: str


@dataclass(frozen=True, kw_only=True)
class Bar:
    start: datetime
    total: int
    label: str
    label_x: float
    segments: tuple[Segment, ...]


@dataclass(frozen=True, kw_only=True)
class GridLine:
    value: int
    y: float


@dataclass(frozen=True, kw_only=True)
class LegendItem:
    outcome: str
    colour: str
    total: int


@dataclass(frozen=True, kw_only=True)
class Chart:
    width: int
    height: int
    plot_left: float
    plot_right: float
    plot_top: float
    plot_bottom: float
    bars: tuple[Bar, ...]
    grid: tuple[GridLine, ...]
    legend: tuple[LegendItem, ...]
    total: int
    label_y: float
    axis_label_x: float


def nice_ceiling(value: int) -> int:
    """The smallest 1, 2 or 5 times a power of ten that is >= value (at least 1)."""
    if value <= 1:
        return 1
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * power >= value:
            return step * power
    return 10 * power  # pragma: no cover - the loop always returns


def grid_steps(ceiling: int) -> int:
    """How many equal, whole-numbered intervals the y axis of a ``nice_ceiling`` gets."""
    if ceiling <= 2:
        return ceiling
    return 4 if str(ceiling)[0] == "2" else 5


def build_chart(
    hours: Sequence[HourOutcomes],
    *,
    width: int = 760,
    height: int = 260,
    label_every: int = 3,
) -> Chart:
    left, right, top, bottom = 44.0, width - 12.0, 12.0, height - 28.0
    plot_height = bottom - top
    peak = max((h.total for h in hours), default=0)
    ceiling = nice_ceiling(peak)
    slot = (right - left) / max(len(hours), 1)
    bar_width = max(slot * 0.72, 1.0)
    bars = []
    for i, hour in enumerate(hours):
        x = left + i * slot + (slot - bar_width) / 2
        y = bottom
        segments = []
        for outcome in OUTCOMES:
            count = hour.counts.get(outcome, 0)
            if not count:
                continue
            h = plot_height * count / ceiling
            y -= h
            segments.append(
                Segment(
                    outcome=outcome,
                    count=count,
                    x=round(x, 2),
                    y=round(y, 2),
                    width=round(bar_width, 2),
                    height=round(h, 2),
                    colour=COLOURS[outcome],
                    title=f"{hour.start:%Y-%m-%d %H}:00 UTC: {count} {outcome}",
                )
            )
        label = f"{hour.start:%H}:00" if i % label_every == 0 or i == len(hours) - 1 else ""
        bars.append(
            Bar(
                start=hour.start,
                total=hour.total,
                label=label,
                label_x=round(x + bar_width / 2, 2),
                segments=tuple(segments),
            )
        )
    steps = grid_steps(ceiling)
    grid = tuple(
        GridLine(value=round(ceiling * k / steps), y=round(bottom - plot_height * k / steps, 2))
        for k in range(steps + 1)
    )
    legend = tuple(
        LegendItem(outcome=o, colour=COLOURS[o], total=sum(h.counts.get(o, 0) for h in hours)) for o in OUTCOMES
    )
    return Chart(
        width=width,
        height=height,
        plot_left=left,
        plot_right=right,
        plot_top=top,
        plot_bottom=bottom,
        bars=tuple(bars),
        grid=grid,
        legend=legend,
        total=sum(h.total for h in hours),
        label_y=bottom + 18,
        axis_label_x=left - 6,
    )
