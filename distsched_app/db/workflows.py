"""Run ids for a workflow's nodes, taken before its rows are written (so edges can name them)."""

from __future__ import annotations

from django.db import connection

from ..models import Run
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
