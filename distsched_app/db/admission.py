"""Admission's lock on PostgreSQL: a partition's row locked, waiting a bounded time, and its
holders counted after the lock was granted, in one round trip.

A claim of limited runs locks each partition it admits into and counts its holders under that
lock (``services.limits.Gate``). Done statement by statement, that was a skip-locked read, and
when another claim held the row (most of the time with several busy workers) a savepoint, a
``lock_timeout``, the waiting read, the savepoint's release, the count and the timeout's reset:
seven round trips, most of them while holding the lock. Here the same statements go to the
server as one pipeline (psycopg's pipeline mode): ``SAVEPOINT``, ``SET LOCAL lock_timeout``, the
row locked ``FOR UPDATE`` (with the operators' overrides in force, when asked), the holders
counted, the timeout reset, ``RELEASE SAVEPOINT``. The server runs them in order, each with its
own snapshot, so the count starts after the lock was granted and sees every hold committed by
the transaction the lock came free from (a count inside the locking statement would not: that
statement's snapshot predates the wait). If the lock is not granted in time the rest of the
pipeline is skipped and the savepoint rolled back: the claim goes on without the partition.

``pick_and_lock`` puts the claim's read of its candidates (``FOR UPDATE SKIP LOCKED``, before
the savepoint) at the head of the same pipeline, with the partitions the worker's previous claim
admitted into: a worker draining limited runs locks its partition without a round trip of its own.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from django.db import connection

from ..models import Limit, LimitPartition
from . import holds
from .claims import _columns, _instance, _q

SAVEPOINT = "distsched_admission"


@cache
def _lock_sql(overrides: bool) -> str:
    limits, partitions = _q(Limit._meta.db_table), _q(LimitPartition._meta.db_table)
    columns = ", ".join(f"p.{_q(f.column)}" for f in _columns(LimitPartition))
    read = (
        f"(SELECT json_object_agg(l.name, l.override) FROM {limits} AS l "  # noqa: S608 - table names
        "WHERE l.override IS NOT NULL AND (l.override_until IS NULL OR l.override_until > %s))"
        if overrides
        else "NULL"
    )
    return (
        f"SELECT {read}, {columns} FROM (SELECT 1) AS one LEFT JOIN LATERAL "  # noqa: S608 - table names
        f'(SELECT * FROM {partitions} WHERE "limit" = %s AND "key" = %s FOR UPDATE) AS p ON true'
    )


def locks_rows() -> bool:
    """Whether this database locks rows (``lock_and_count`` is for those only)."""
    return connection.features.has_select_for_update


@dataclass(frozen=True)
class Locked:
    partition: LimitPartition | None  # locked until COMMIT; None: no such row yet
    holders: int  # the partition's live holds, counted after the lock was granted
    overrides: dict[str, dict[str, Any]] | None  # {limit: numbers} in force, when asked for


def lock_and_count(limit: str, key: str, now: datetime, *, timeout_ms: int, overrides: bool = False) -> Locked | None:
    """Lock the partition's row (waiting at most ``timeout_ms``) and count its live holds, one
    round trip; with ``overrides``, also read the overrides in force at ``now`` (as
    ``limits.active_overrides``). None when the lock was not granted in time."""
    _, locked = pick_and_lock(None, [(limit, key)], now, timeout_ms=timeout_ms, overrides=overrides)
    return None if locked is None else locked[(limit, key)]


def pick_and_lock(
    pick: tuple[str, Sequence[Any]] | None,
    pairs: Sequence[tuple[str, str]],
    now: datetime,
    *,
    timeout_ms: int,
    overrides: bool = False,
) -> tuple[list[tuple], dict[tuple[str, str], Locked] | None]:
    """``pick`` (a statement and its parameters: the claim's candidates, locked ``SKIP LOCKED``),
    then each of ``pairs`` (limit, partition key) locked and counted as ``lock_and_count`` does,
    all in one round trip: a claim that expects to admit into these partitions (its previous
    claim did) needs no round trip of its own to lock them. ``overrides``: the first lock's
    statement also reads the overrides in force. Returns the pick's rows and the locks, or None
    for the locks when one was not granted in time: then none is kept (the savepoint after the
    pick is rolled back), while the pick's row locks, taken before the savepoint, are kept."""
    import psycopg

    connection.ensure_connection()
    conn = connection.connection
    rows: list[tuple] = []
    with connection.wrap_database_errors, ExitStack() as stack:
        picker = stack.enter_context(psycopg.Cursor(conn))
        lockers = [stack.enter_context(psycopg.Cursor(conn)) for _ in pairs]
        counters = [stack.enter_context(psycopg.Cursor(conn)) for _ in pairs]
        try:
            with psycopg.Cursor(conn) as control, conn.pipeline():  # sent together, read at its end
                if pick is not None:
                    picker.execute(*pick)
                if pairs:
                    control.execute(f"SAVEPOINT {SAVEPOINT}")
                    control.execute(f"SET LOCAL lock_timeout = '{int(timeout_ms)}ms'")
                    for i, (limit, key) in enumerate(pairs):
                        first = overrides and i == 0
                        lockers[i].execute(_lock_sql(first), ([now] if first else []) + [limit, key])
                        counters[i].execute(holds.live_sql(by_key=True), [limit, now, key])
                    control.execute("SET LOCAL lock_timeout TO DEFAULT")
                    control.execute(f"RELEASE SAVEPOINT {SAVEPOINT}")
        except psycopg.errors.LockNotAvailable:
            with psycopg.Cursor(conn) as control:
                control.execute(f"ROLLBACK TO SAVEPOINT {SAVEPOINT}")  # the timeout's SET LOCAL too
                control.execute(f"RELEASE SAVEPOINT {SAVEPOINT}")
            return (picker.fetchall() if pick is not None else []), None
        if pick is not None:
            rows = picker.fetchall()
        locked: dict[tuple[str, str], Locked] = {}
        for i, pair in enumerate(pairs):
            one, total = lockers[i].fetchone(), counters[i].fetchone()
            assert one is not None and total is not None  # noqa: S101 - each statement returns one row
            values, *row = one
            [n] = total
            read: dict[str, dict[str, Any]] | None = None
            if overrides and i == 0:
                if isinstance(values, str):
                    values = json.loads(values)
                read = {name: numbers for name, numbers in (values or {}).items() if numbers}
            partition = _instance(LimitPartition, row) if row[0] is not None else None
            locked[pair] = Locked(partition, int(n), read)
    return rows, locked
