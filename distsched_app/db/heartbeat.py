"""A worker's heartbeat on PostgreSQL as one statement: the worker row and every lease it holds.

At a thousand workers the heartbeat is most of what a live fleet costs the database
(``bench/thousand_workers.py``): as separate transactions (the row, a fencing read, the
renewal) it was three round trips and two commits per worker per beat. Here it is one
data-modifying statement, one commit. Fencing is unchanged: a lease is extended only
where the run is still leased or running, owned by this worker, at the attempt it holds
(the UPDATE's WHERE, which PostgreSQL re-checks on the latest version of a row another
transaction changed meanwhile). SQLite runs the same three steps in one ``BEGIN
IMMEDIATE`` transaction (``services.outcomes.renew_leases``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from django.db import connection
from django.db.models import Field, Model

from ..models import LEASED_STATES, Run, Worker


@dataclass(frozen=True, kw_only=True)
class RowBeat:
    """What the beat writes on the worker row (None: leave the column as it is)."""

    heartbeat_at: datetime
    current_run_id: int | None = None
    status: str | None = None
    runs_executed: int | None = None
    clock_skew_seconds: float | None = None


@dataclass(frozen=True, kw_only=True)
class BeatResult:
    alive: bool | None  # the worker row was there (None: no row was written)
    renewed: dict[int, bool]  # run id -> cancel requested, for every lease extended


def _column(model: type[Model], name: str) -> str:
    field = model._meta.get_field(name)
    assert isinstance(field, Field) and field.column  # noqa: S101 - a concrete column, named by this module
    return connection.ops.quote_name(field.column)


@cache
def beat_sql(with_row: bool) -> str:
    """The statement (``%(name)s`` parameters): renew the fenced leases, move the worker row."""
    q = connection.ops.quote_name
    runs, workers = q(Run._meta.db_table), q(Worker._meta.db_table)
    states = ", ".join(f"'{s}'" for s in LEASED_STATES)  # enum literals
    c = lambda name: _column(Run, name)  # noqa: E731
    # "state || ''" as in db.fencing: the primary key alone, not the leased runs' partial index too.
    renewed = (
        f"renewed AS (UPDATE {runs} AS r SET {c('lease_expires_at')} = %(expires)s, {c('updated_at')} = %(now)s "  # noqa: S608
        "FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS h(id, attempt) "
        f"WHERE r.{c('id')} = h.id AND r.{c('attempts')} = h.attempt AND r.{c('lease_owner')} = %(owner)s "
        f"AND (r.{c('state')} || '') IN ({states}) RETURNING r.{c('id')} AS id, r.{c('cancel_requested')} AS cancel)"
    )
    if not with_row:
        return f"WITH {renewed} SELECT id, cancel FROM renewed"  # noqa: S608 - names and literals
    w = lambda name: _column(Worker, name)  # noqa: E731
    keep = ", ".join(
        f"{w(name)} = COALESCE(%({name})s, {w(name)})" for name in ("status", "runs_executed", "clock_skew_seconds")
    )
    row = (
        f"row AS (UPDATE {workers} SET {w('heartbeat_at')} = %(beat_at)s, "  # noqa: S608
        f"{w('current_run')} = %(current_run_id)s, {keep} WHERE {w('worker_id')} = %(owner)s RETURNING 1)"
    )
    # The row's line first: NULL id, its presence says the worker row was there.
    return f"WITH {renewed}, {row} SELECT NULL, NULL FROM row UNION ALL SELECT id, cancel FROM renewed"  # noqa: S608


def beat(
    *, worker_id: str, held: Mapping[int, int], now: datetime, expires: datetime, row: RowBeat | None
) -> BeatResult:
    """One heartbeat in one statement (PostgreSQL only): autocommit, or the caller's transaction."""
    ids = list(held)
    params: dict[str, Any] = {
        "ids": ids,
        "attempts": [held[i] for i in ids],
        "owner": worker_id,
        "expires": expires,
        "now": now,
    }
    if row is not None:
        params.update(
            beat_at=row.heartbeat_at,
            current_run_id=row.current_run_id,
            status=row.status,
            runs_executed=row.runs_executed,
            clock_skew_seconds=row.clock_skew_seconds,
        )
    with connection.cursor() as cursor:
        cursor.execute(beat_sql(row is not None), params)
        rows = cursor.fetchall()
    renewed = {int(run_id): bool(cancel) for run_id, cancel in rows if run_id is not None}
    alive = None if row is None else any(run_id is None for run_id, _ in rows)
    return BeatResult(alive=alive, renewed=renewed)
