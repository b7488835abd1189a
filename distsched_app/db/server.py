"""What only some database servers can tell: their own clock, a table's row estimate,
and whether counting a big index range is worth caching.

Each answers ``None`` (or False) where the question has no meaning, so
callers hold no vendor checks of their own.
"""

from __future__ import annotations

import json
from datetime import datetime

from django.db import connection, connections
from django.db.models import Model, QuerySet


def clock_timestamp() -> datetime | None:
    """The database server's clock now (PostgreSQL's ``clock_timestamp()``, aware).

    None on SQLite: the database is a file on this machine, so it has no clock of its own.
    """
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        (now,) = cursor.fetchone()
    return now


def row_estimate(model: type[Model], *, using: str = "default") -> int | None:
    """The planner's estimate of the table's row count (PostgreSQL's ``pg_class.reltuples``,
    kept fresh by autovacuum; -1 for a table never analysed), read in one catalog lookup.

    None on SQLite, which counts a million-row table from its smallest index in milliseconds.
    """
    db = connections[using]
    if db.vendor != "postgresql":
        return None
    with db.cursor() as cursor:
        cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass", [model._meta.db_table])
        row = cursor.fetchone()
    return int(row[0]) if row and row[0] is not None else -1


def query_estimate(qs: QuerySet) -> int | None:
    """The planner's estimate of the rows ``qs`` returns (PostgreSQL ``EXPLAIN``, no execution);
    None on SQLite."""
    db = connections[qs.db]
    if db.vendor != "postgresql":
        return None
    sql, params = qs.order_by().query.sql_with_params()
    with db.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    return int(plan[0]["Plan"]["Plan Rows"])


def counts_are_costly() -> bool:
    """Whether counting hundreds of thousands of index entries costs enough to cache the figure
    (``services.stats.run_counts``): PostgreSQL, where 900,000 cost ~90 ms. SQLite
    counts as many in ~70 ms and is never cached.
    """
    return connection.vendor == "postgresql"


def describe(using: str = "default") -> str:
    """The database a process talks to, for its start log line: vendor, server and name,
    as a URL without user or password (``postgresql://db1:5432/distsched``,
    ``sqlite:////var/lib/distsched/db.sqlite3``), so two processes on different
    databases are told apart at a glance and no credential reaches a log."""
    db = connections[using]
    settings = db.settings_dict
    name = str(settings.get("NAME") or "")
    if db.vendor == "sqlite":
        return f"sqlite:///{name}"  # a path: sqlite:////abs/db.sqlite3, as DATABASE_URL writes it
    host, port = str(settings.get("HOST") or ""), str(settings.get("PORT") or "")
    return f"{db.vendor}://{host}{':' + port if port else ''}/{name}"
