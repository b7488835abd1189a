"""Geometry of a workflow's graph, drawn as inline SVG on its admin page (no JavaScript).

Pure: nodes (id, run, state, upstream ids) in, boxes and arrows out. A node's column is its
depth (the longest path from a node without upstreams), its row its order within the column.
Boxes are coloured by their run's state and link to the run's page. Past ``MAX_DRAWN`` nodes the
page shows the table only: a picture of 10,000 boxes helps nobody.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

MAX_DRAWN = 300
BOX_W, BOX_H, GAP_X, GAP_Y, PAD = 150, 34, 60, 14, 10

COLOURS: dict[str, str] = {
    "succeeded": "#3b8a3e",
    "running": "#2a6fb0",
    "leased": "#2a6fb0",
    "pending": "#8e9aa6",
    "retrying": "#e0a100",
    "blocked": "#c9d1d9",
    "dead": "#c0392b",
    "cancelled": "#7f8c8d",
    "skipped": "#b58ac9",
}
DARK_TEXT = {"blocked", "pending"}


@dataclass(frozen=True, kw_only=True)
class Box:
    id: str
    run: int
    state: str
    x: float
    y: float
    colour: str
    text_colour: str


@dataclass(frozen=True, kw_only=True)
class Arrow:
    x1: float
    y1: float
    x2: float
    y2: float


@dataclass(frozen=True, kw_only=True)
class Graph:
    width: float
    height: float
    boxes: tuple[Box, ...]
    arrows: tuple[Arrow, ...]


def layout(nodes: Sequence[tuple[str, int, str, Sequence[str]]]) -> Graph:
    """``nodes``: ``(id, run id, state, upstream ids)`` in topological order (runs' id order)."""
    depth: dict[str, int] = {}
    for node_id, _, _, after in nodes:
        depth[node_id] = 1 + max((depth.get(up, 0) for up in after), default=-1)
    rows: dict[int, int] = {}
    place: dict[str, tuple[float, float]] = {}
    boxes = []
    for node_id, run, state, _ in nodes:
        column = depth[node_id]
        row = rows.get(column, 0)
        rows[column] = row + 1
        x, y = PAD + column * (BOX_W + GAP_X), PAD + row * (BOX_H + GAP_Y)
        place[node_id] = (x, y)
        boxes.append(
            Box(
                id=node_id, run=run, state=state, x=x, y=y, colour=COLOURS.get(state, "#8e9aa6"),
                text_colour="#1f2328" if state in DARK_TEXT else "#ffffff",
            )
        )  # fmt: skip
    arrows = [
        Arrow(
            x1=place[up][0] + BOX_W, y1=place[up][1] + BOX_H / 2, x2=place[node_id][0], y2=place[node_id][1] + BOX_H / 2
        )
        for node_id, _, _, after in nodes
        for up in after
        if up in place
    ]
    columns = max(rows, default=0) + 1
    height = max(rows.values(), default=1)
    return Graph(
        width=2 * PAD + columns * BOX_W + (columns - 1) * GAP_X,
        height=2 * PAD + height * BOX_H + (height - 1) * GAP_Y,
        boxes=tuple(boxes),
        arrows=tuple(arrows),
    )


def svg(graph: Graph, run_url: str) -> SafeString:
    """The graph as an ``<svg>`` element; ``run_url`` has ``{}`` where a run id goes."""
    arrows = format_html_join(
        "",
        "<line x1='{}' y1='{}' x2='{}' y2='{}' stroke='#57606a' stroke-width='1.5' "
        "marker-end='url(#distsched-arrow)'/>",
        ((a.x1, a.y1, a.x2 - 2, a.y2) for a in graph.arrows),
    )
    boxes = format_html_join(
        "",
        "<a href='{}'><g class='distsched-node' data-node='{}' data-state='{}'><title>{} (run {}): {}</title>"
        "<rect x='{}' y='{}' width='{}' height='{}' rx='5' fill='{}' stroke='#57606a'/>"
        "<text x='{}' y='{}' fill='{}' font-size='12' text-anchor='middle'>{}</text></g></a>",
        (
            (
                run_url.replace("{}", str(b.run)), b.id, b.state, b.id, b.run, b.state, b.x, b.y, BOX_W, BOX_H,
                b.colour, b.x + BOX_W / 2, b.y + BOX_H / 2 + 4, b.text_colour, _short(b.id),
            )
            for b in graph.boxes
        ),
    )  # fmt: skip
    marker = mark_safe(
        "<defs><marker id='distsched-arrow' viewBox='0 0 10 10' refX='10' refY='5' markerWidth='7' "
        "markerHeight='7' orient='auto'><path d='M0,0 L10,5 L0,10 z' fill='#57606a'/></marker></defs>"
    )
    return format_html(
        "<svg class='distsched-graph' xmlns='http://www.w3.org/2000/svg' width='{}' height='{}' "
        "viewBox='0 0 {} {}' role='img'>{}{}{}</svg>",
        graph.width, graph.height, graph.width, graph.height, marker, arrows, boxes,
    )  # fmt: skip


def _short(text: str, limit: int = 20) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
