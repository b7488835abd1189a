"""Workflow statements that differ by database: run ids taken before a workflow's rows are
written (so edges can name them), and the two statements of a finish (edges marked done,
waiting downstream nodes locked and read)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.db import connection

from ..models import Run, WorkflowEdge, WorkflowNode
from ..workflow_models import WAITING_PREFIX
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


def _ids_param(ids: Sequence[int]) -> tuple[str, list[Any]]:
    """``IN (...)`` for a list of ids: one array (PostgreSQL) or one JSON text (SQLite)."""
    if connection.vendor == "postgresql":
        return "= ANY(%s)", [list(ids)]
    return "IN (SELECT value FROM json_each(%s))", [json.dumps(list(ids))]


def mark_edges_done(upstream_ids: Sequence[int]) -> list[tuple[int, int]]:
    """Mark the edges out of these (just ended) runs done, in one statement; their
    ``(upstream, downstream)`` pairs."""
    if not upstream_ids:
        return []
    edges = connection.ops.quote_name(WorkflowEdge._meta.db_table)
    where, params = _ids_param(upstream_ids)
    true = "true" if connection.vendor == "postgresql" else "1"
    sql = f"UPDATE {edges} SET done = {true} WHERE upstream_id {where} RETURNING upstream_id, downstream_id"  # noqa: S608
    return [(up, down) for up, down in execute(sql, params)]


def lock_waiting_nodes(run_ids: Sequence[int]) -> list[tuple[int, int, str, bool]]:
    """Of these runs, the workflow nodes still waiting (``blocked`` on their workflow), locked
    until COMMIT, in id order: ``(run id, workflow id, on_upstream_failure, still waits)``,
    where "still waits" is whether an edge into it is not done.

    The edges are read *after* the lock is held: on PostgreSQL a second statement, so that a
    transaction that waited for the lock reads what the holder committed (READ COMMITTED takes a
    new snapshot per statement; a subquery of the locking statement would read the old one).
    SQLite has no row locks and needs none (its writers are serialised): one statement.
    """
    if not run_ids:
        return []
    q = connection.ops.quote_name
    runs, nodes, edges = q(Run._meta.db_table), q(WorkflowNode._meta.db_table), q(WorkflowEdge._meta.db_table)
    where, params = _ids_param(run_ids)
    prefix = f"{WAITING_PREFIX}%"
    base = (
        f"SELECT r.id, r.workflow_id, n.on_upstream_failure{{extra}} FROM {runs} r "  # noqa: S608 - names only
        f"JOIN {nodes} n ON n.run_id = r.id WHERE r.id {where} AND r.state = 'blocked' AND r.held_by LIKE %s "
        "ORDER BY r.id"
    )
    waits = f"EXISTS (SELECT 1 FROM {edges} e WHERE e.downstream_id = r.id AND NOT e.done)"  # noqa: S608
    if connection.vendor != "postgresql":
        rows = execute(base.format(extra=f", {waits}"), [*params, prefix])
        return [(r, w, rule, bool(still)) for r, w, rule, still in rows]
    locked = execute(base.format(extra="") + " FOR UPDATE OF r", [*params, prefix])
    if not locked:
        return []
    ids = [row[0] for row in locked]
    where, params = _ids_param(ids)
    sql = f"SELECT DISTINCT downstream_id FROM {edges} WHERE downstream_id {where} AND NOT done"  # noqa: S608
    still = {row[0] for row in execute(sql, params)}
    return [(r, w, rule, r in still) for r, w, rule in locked]
