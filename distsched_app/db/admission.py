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

**Stripes.** A large concurrency cap of an unpartitioned limit (``services.limits``) is split
over ``STRIPES`` transaction-level advisory locks, each admitting up to its share of the cap
(the hold records its stripe). A claim tries them from its preferred one and takes the first
free one without waiting (``pg_try_advisory_xact_lock``): claims of several workers then admit
side by side instead of queueing on the partition's row. The count that follows is per stripe:
the live holds of the stripe locked, exactly, and the hold rows of the others, an upper bound
(``holds.one_stripe_sql``).
Anything that must see the whole limit (blocking a run, a cap too small to split) locks the row
and then every stripe, waiting; so a stripe's count is exact under its lock, and the whole
limit's under all of them.

``pick_and_lock`` puts the claim's read of its candidates (``FOR UPDATE SKIP LOCKED``, before
the savepoint) at the head of the same pipeline, with the partitions the worker's previous claim
admitted into: a worker draining limited runs locks its partition without a round trip of its own.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from django.db import connection

from ..models import Limit, LimitPartition
from . import holds, timestamps
from .claims import _columns, _instance, _q

SAVEPOINT = "distsched_admission"
STRIPES = 8  # lock stripes of a striped partition (its holds' ``stripe`` is 0 .. STRIPES - 1)


def stripe_lock_key(limit: str, key: str) -> int:
    """The first key of a partition's stripes' advisory locks (the stripe is the second): a
    signed 32-bit hash of its names. Two partitions sharing it only wait for each other."""
    value = zlib.crc32(f"distsched.limit\0{limit}\0{key}".encode())
    return value - (1 << 32) if value >= 1 << 31 else value


def _overrides_sql(overrides: bool) -> str:
    limits = _q(Limit._meta.db_table)
    return (
        f"(SELECT json_object_agg(l.name, l.override) FROM {limits} AS l "  # noqa: S608 - table names
        "WHERE l.override IS NOT NULL AND (l.override_until IS NULL OR l.override_until > %s))"
        if overrides
        else "NULL"
    )


@cache
def _try_stripe_sql(overrides: bool) -> str:
    """One free stripe locked, tried from the preferred one on (no waiting): its number, NULL when
    every stripe is taken. The locking function runs row by row until one is granted."""
    return (
        f"SELECT {_overrides_sql(overrides)}, (SELECT t.s FROM (SELECT mod(%s::int + g, {STRIPES}) AS s "  # noqa: S608
        f"FROM generate_series(0, {STRIPES - 1}) AS g) AS t WHERE pg_try_advisory_xact_lock(%s::int, t.s) LIMIT 1)"
    )


ALL_STRIPES_SQL = f"SELECT count(pg_advisory_xact_lock(%s::int, g)) FROM generate_series(0, {STRIPES - 1}) AS g"  # noqa: S608


@cache
def _lock_sql(overrides: bool) -> str:
    partitions = _q(LimitPartition._meta.db_table)
    columns = ", ".join(f"p.{_q(f.column)}" for f in _columns(LimitPartition))
    read = _overrides_sql(overrides)
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
    stripe: int | None = None  # a striped lock's: the one stripe locked (None: all, or none free)
    # A striped lock's holds per stripe: live ones, exactly, of those locked; of the others (one
    # stripe tried) an upper bound, their hold rows.
    by_stripe: dict[int, int] | None = None


def begins_transaction() -> bool:
    """Whether ``pick_and_lock`` would open the transaction itself (see ``_begun_in_pipeline``)."""
    from psycopg.pq import TransactionStatus

    connection.ensure_connection()
    conn = connection.connection
    return getattr(conn, "_autocommit", None) is False and conn.pgconn.transaction_status == TransactionStatus.IDLE


def begin_command(conn: Any) -> bytes:
    """The ``BEGIN`` psycopg itself would send to open a transaction on ``conn`` (with the isolation
    level, read-only and deferrable settings Django's ``OPTIONS`` gave it)."""
    command = getattr(conn, "_get_tx_start_command", None)
    return command() if callable(command) else b"BEGIN"


@contextmanager
def _begun_in_pipeline(conn: Any) -> Iterator[bool]:
    """Whether the pipeline starts the transaction itself: its first statement a ``BEGIN``.

    Inside ``transaction.atomic()`` psycopg starts the transaction on the first statement by
    sending ``BEGIN`` and waiting for it (a round trip of its own, even in pipeline mode). When
    nothing was sent yet in this transaction (the connection idle, not in autocommit), the
    pipeline sends the ``BEGIN`` itself, psycopg told meanwhile not to (its ``_autocommit``
    flag, restored at once; a psycopg without that attribute keeps its own way). The server
    then runs the pipeline's statements in the transaction that ``BEGIN`` opened, which stays
    open after the pipeline's sync, as psycopg's own would: the claim's later statements and
    its COMMIT go on in it."""
    if not begins_transaction():
        yield False
        return
    conn._autocommit = True
    try:
        yield True
    finally:
        conn._autocommit = False


def lock_and_count(
    limit: str,
    key: str,
    now: datetime,
    *,
    timeout_ms: int,
    overrides: bool = False,
    stripes: bool = False,
    prefer: int | None = None,
) -> Locked | None:
    """Lock the partition's row (waiting at most ``timeout_ms``) and count its live holds, one
    round trip; with ``overrides``, also read the overrides in force at ``now`` (as
    ``limits.active_overrides``). None when the lock was not granted in time. ``stripes``: a
    striped partition; with ``prefer``, one free stripe is tried from that one (no row lock, no
    wait: ``stripe`` None if none was free), else the row and every stripe are locked."""
    striped = {(limit, key): prefer} if stripes else {}
    _, locked = pick_and_lock(None, [(limit, key)], now, timeout_ms=timeout_ms, overrides=overrides, stripes=striped)
    return None if locked is None else locked[(limit, key)]


def _one_stripe_counts(
    rows: Sequence[tuple], stripe: int | None, tried: int | None, pair: tuple[str, str], now: datetime
) -> dict[int, int]:
    """A tried stripe's counts (``holds.one_stripe_sql`` rows): the hold rows of each stripe (an
    upper bound of its live holds) and, for the stripe locked, its live holds. Live holds were
    looked up for the stripe tried first; when another one was free, the same statement runs
    again for that one (the lock is held: the count is as exact as in the pipeline)."""
    counts = {int(s): int(n) for s, n, _ in rows}
    if stripe is None:
        return counts
    if tried is None or stripe != tried % STRIPES:
        with connection.cursor() as cursor:
            cursor.execute(holds.one_stripe_sql(), [stripe, now, *pair])
            rows = cursor.fetchall()
    counts[stripe] = next((int(n) for s, _, n in rows if int(s) == stripe), 0)
    return counts


def pick_and_lock(
    pick: tuple[str, Sequence[Any]] | None,
    pairs: Sequence[tuple[str, str]],
    now: datetime,
    *,
    timeout_ms: int,
    overrides: bool = False,
    stripes: Mapping[tuple[str, str], int | None] = {},
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
        begin = stack.enter_context(_begun_in_pipeline(conn))
        picker = timestamps.read_natively(stack.enter_context(psycopg.Cursor(conn)))
        lockers = [stack.enter_context(psycopg.Cursor(conn)) for _ in pairs]
        counters = [stack.enter_context(psycopg.Cursor(conn)) for _ in pairs]
        stripers = [stack.enter_context(psycopg.Cursor(conn)) for _ in pairs]
        # Only stripes tried (never waited for): no savepoint and no timeout to set around them.
        waits = any(pair not in stripes or stripes[pair] is None for pair in pairs)
        try:
            with psycopg.Cursor(conn) as control, conn.pipeline():  # sent together, read at its end
                if begin:
                    control.execute(begin_command(conn))
                if pick is not None:
                    picker.execute(*pick)
                if waits:
                    control.execute(f"SAVEPOINT {SAVEPOINT}")
                    control.execute(f"SET LOCAL lock_timeout = '{int(timeout_ms)}ms'")
                for i, (limit, key) in enumerate(pairs):
                    first = overrides and i == 0
                    at = [now] if first else []
                    if (limit, key) not in stripes:
                        lockers[i].execute(_lock_sql(first), [*at, limit, key])
                        counters[i].execute(holds.live_sql(by_key=True), [limit, now, key])
                        continue
                    prefer, lock_key = stripes[(limit, key)], stripe_lock_key(limit, key)
                    if prefer is None:
                        lockers[i].execute(_lock_sql(first), [*at, limit, key])
                        stripers[i].execute(ALL_STRIPES_SQL, [lock_key])
                        counters[i].execute(holds.live_by_stripe_sql(), [limit, now, key])
                    else:
                        lockers[i].execute(_try_stripe_sql(first), [*at, prefer % STRIPES, lock_key])
                        counters[i].execute(holds.one_stripe_sql(), [prefer % STRIPES, now, limit, key])
                if waits:
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
            one = lockers[i].fetchone()
            assert one is not None  # noqa: S101 - the locking statement returns one row
            values, *row = one
            stripe, by_stripe = None, None
            if pair in stripes and stripes[pair] is None:  # the row and every stripe: all counted exactly
                by_stripe = {int(s): int(n) for s, n in counters[i].fetchall()}
                n = sum(by_stripe.values())
            elif pair in stripes:  # one stripe tried: no row locked, the stripe locked counted exactly
                stripe, row = (None if row[0] is None else int(row[0])), [None]
                by_stripe = _one_stripe_counts(counters[i].fetchall(), stripe, stripes[pair], pair, now)
                n = sum(by_stripe.values())
            else:
                total = counters[i].fetchone()
                assert total is not None  # noqa: S101 - a count returns one row
                [n] = total
            read: dict[str, dict[str, Any]] | None = None
            if overrides and i == 0:
                if isinstance(values, str):
                    values = json.loads(values)
                read = {name: numbers for name, numbers in (values or {}).items() if numbers}
            partition = _instance(LimitPartition, row) if row[0] is not None else None
            locked[pair] = Locked(partition, int(n), read, stripe, by_stripe)
    return rows, locked
