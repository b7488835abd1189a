"""Workflow statements that differ by database: run ids taken before a workflow's rows are
written (so edges can name them), and the statements of a finish (edges marked done, waiting
downstream nodes locked and read: two statements on SQLite, three on PostgreSQL)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from django.db import connection

from ..models import Run, WorkflowEdge, WorkflowNode
from ..workflow_models import WAITING_EDGES_INDEX, WAITING_PREFIX
from .runs import _next_id_sql, execute


def reserve_run_ids(n: int) -> list[int]:
    """``n`` fresh run ids, in increasing order, for rows the caller inserts with them.

    PostgreSQL: ``n`` values of the runs' sequence in one statement. SQLite: the block after the
    highest id ``AUTOINCREMENT`` ever gave; the caller's transaction holds the write lock
    (``BEGIN IMMEDIATE``) until its rows are in, so nobody else can take them.
    """
    if n <= 0:
        return []
    if connection.vendor == "postgresql":
        rows = execute(
            "SELECT nextval(pg_get_serial_sequence(%s, 'id')) FROM generate_series(1, %s)", [Run._meta.db_table, n]
        )
        return sorted(row[0] for row in rows)
    first = execute(_next_id_sql(), [])[0][0]
    return list(range(first, first + n))


WaitingNode = tuple[int, int, str, bool]
"""``(run id, workflow id, on_upstream_failure, still waits)`` of a waiting downstream node."""


def end_edges(upstream_ids: Sequence[int]) -> tuple[list[tuple[int, int]], list[WaitingNode]]:
    """These runs just ended: mark the edges out of them done and read their downstream nodes
    still waiting. Returns the ``(upstream, downstream)`` pairs, and the waiting nodes in id order,
    each with whether an edge into it is still not done.

    Two statements on SQLite, three on PostgreSQL (``_waiting_nodes``). "Still waits" is one probe
    of the partial index of edges not done per node, stopping at the first edge found: a node's
    finished siblings are never read, and neither are the other edges still waiting.
    """
    if not upstream_ids:
        return [], []
    edges = connection.ops.quote_name(WorkflowEdge._meta.db_table)
    param: list[int] | str
    if connection.vendor == "postgresql":
        where, param = "= ANY(%s)", list(upstream_ids)
    else:
        where, param = "IN (SELECT value FROM json_each(%s))", json.dumps(list(upstream_ids))
    true = "true" if connection.vendor == "postgresql" else "1"
    sql = f"UPDATE {edges} SET done = {true} WHERE upstream_id {where} RETURNING upstream_id, downstream_id"  # noqa: S608
    marked = [(up, down) for up, down in execute(sql, [param])]
    if not marked:
        return [], []
    return marked, _waiting_nodes(sorted({down for _, down in marked}))


def _waiting_nodes(run_ids: list[int]) -> list[WaitingNode]:
    """Of these runs, the workflow nodes still waiting (``blocked`` on their workflow), locked
    until COMMIT, in id order, with whether each still waits.

    PostgreSQL: the rows are locked first, and their edges read in a second statement, so that a
    transaction that waited for a lock reads what the holder committed (READ COMMITTED takes a
    new snapshot per statement; a subquery of the locking statement would read the old one).
    SQLite has no row locks and needs none (its writers are serialised): one statement. It names
    the partial index (``INDEXED BY``): with statistics taken while every edge of a fan-in waited,
    its planner scanned the whole edge table instead, every finished sibling included, on every
    finish (and a missing index is an error, not a silent scan).
    """
    q = connection.ops.quote_name
    runs, nodes, edges = q(Run._meta.db_table), q(WorkflowNode._meta.db_table), q(WorkflowEdge._meta.db_table)
    base = (
        f"SELECT r.id, r.workflow_id, n.on_upstream_failure{{extra}} FROM {runs} r "  # noqa: S608 - names only
        f"JOIN {nodes} n ON n.run_id = r.id WHERE r.id {{ids}} AND r.state = 'blocked' AND r.held_by LIKE %s "
        "ORDER BY r.id"
    )
    prefix = f"{WAITING_PREFIX}%"
    if connection.vendor != "postgresql":
        waits = (
            f"EXISTS (SELECT 1 FROM {edges} e INDEXED BY {q(WAITING_EDGES_INDEX)} "  # noqa: S608 - names only
            # Both spellings of "not done": SQLite uses a partial index only when the query repeats its
            # condition, which Django 5.2 writes ``NOT "done"`` and Django 6 ``"done" = 0``.
            "WHERE e.downstream_id = r.id AND NOT e.done AND e.done = 0)"
        )
        sql = base.format(extra=f", {waits}", ids="IN (SELECT value FROM json_each(%s))")
        return [(r, w, rule, bool(still)) for r, w, rule, still in execute(sql, [json.dumps(run_ids), prefix])]
    locked = execute(base.format(extra="", ids="= ANY(%s)") + " FOR UPDATE OF r", [run_ids, prefix])
    if not locked:
        return []
    sql = (
        "SELECT d FROM unnest(%s::bigint[]) AS d "  # noqa: S608 - names only
        f"WHERE EXISTS (SELECT 1 FROM {edges} e WHERE e.downstream_id = d AND NOT e.done)"
    )
    still = {row[0] for row in execute(sql, [[row[0] for row in locked]])}
    return [(r, w, rule, r in still) for r, w, rule in locked]
