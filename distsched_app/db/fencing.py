"""The fencing read of a worker's batch: which of these runs it still holds, and at which
attempt, in one statement prepared once per shape (the worker's hot path: every batch of
outcomes and every heartbeat reads it)."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from functools import cache

from django.db import connection
from django.db.models import Field

from ..models import LEASED_STATES, Run


def _field(name: str) -> Field:
    field = Run._meta.get_field(name)
    assert isinstance(field, Field)  # noqa: S101 - a concrete column of Run, named by this module's callers
    return field


@cache
def _sql(vendor: str, extra: tuple[str, ...], lock: bool) -> str:
    q = connection.ops.quote_name
    columns = ", ".join(q(_field(name).column) for name in ("id", "attempts", *extra))
    # PostgreSQL binds the ids as one array; SQLite as one JSON array (one statement text whatever the batch).
    ids = "id = ANY(%s)" if vendor == "postgresql" else "id IN (SELECT value FROM json_each(%s))"
    states = ", ".join(f"'{s}'" for s in LEASED_STATES)  # enum literals
    # "state || ''" keeps both planners on the primary key: on the bare column PostgreSQL matched the
    # leased runs' partial index too and combined the two (a BitmapAnd reading every leased run).
    sql = (
        f"SELECT {columns} FROM {q(Run._meta.db_table)} "  # noqa: S608 - names and enum literals
        f"WHERE {ids} AND lease_owner = %s AND (state || '') IN ({states})"
    )
    # Locked in id order (the order the index scan gives anyway, stated): every path that locks
    # several runs takes them in id order, so two of them never wait for each other in a cycle.
    return sql + (" ORDER BY id FOR UPDATE" if lock and connection.features.has_select_for_update else "")


def held_rows(worker_id: str, ids: Collection[int], *, extra: Sequence[str] = (), lock: bool = False) -> list[tuple]:
    """``(id, attempts, *extra)`` of the runs among ``ids`` that ``worker_id`` leases (leased or
    running), locked until COMMIT with ``lock`` (PostgreSQL; SQLite's transaction holds the
    write lock). Boolean ``extra`` fields come back as ``bool`` on both databases."""
    if not ids:
        return []
    vendor = connection.vendor
    param: list[int] | str = list(ids) if vendor == "postgresql" else json.dumps(list(ids))
    with connection.cursor() as cursor:
        cursor.execute(_sql(vendor, tuple(extra), lock), [param, worker_id])
        rows = cursor.fetchall()
    kinds = [_field(name).get_internal_type() for name in extra]
    booleans = [i + 2 for i, kind in enumerate(kinds) if kind == "BooleanField"]
    if booleans and vendor != "postgresql":
        rows = [tuple(bool(v) if i in booleans else v for i, v in enumerate(row)) for row in rows]
    return rows
