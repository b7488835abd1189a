"""Limit holds on the hot path: what a release frees, in as few round trips as each database allows.

Every recorded batch of outcomes under a limit deletes its runs' holds and asks whether the
limits they held have blocked runs (``services.limits.release``). On PostgreSQL that is one
statement (a ``DELETE ... RETURNING`` in a CTE, grouped, with an index probe of the blocked runs
per limit); SQLite has no data-modifying CTEs: the delete, then a probe per freed pair that was
not tight, under the write lock its transaction holds.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from itertools import chain
from typing import Any

from django.db import connection

from ..models import LEASED_STATES, LimitHold, Run, RunState
from . import bulk


@dataclass(frozen=True)
class Freed:
    """Slots of one (limit, partition) freed by a release."""

    limit: str
    key: str
    slots: int
    tight: bool  # one of them was taken while the limit was more than half full
    blocked: bool  # the limit had blocked runs (any partition) when looked at; only read if not tight


def _q(name: str) -> str:
    return connection.ops.quote_name(name)


def _blocked_sql(limit: str, prefix: str) -> str:
    """Whether ``limit`` (an SQL expression) has blocked runs: ``held_by`` in
    [``<prefix><limit>:``, ``<prefix><limit>;``), the range ``services.limits`` reads them by
    (the blocked runs' partial index)."""
    runs = _q(Run._meta.db_table)
    return (
        f"EXISTS (SELECT 1 FROM {runs} AS b WHERE b.state = '{RunState.BLOCKED.value}' "  # noqa: S608
        f"AND b.held_by >= '{prefix}' || {limit} || ':' AND b.held_by < '{prefix}' || {limit} || ';')"
    )


@cache
def _release_sql(vendor: str, prefix: str) -> str:
    holds = _q(LimitHold._meta.db_table)
    if vendor == "postgresql":
        blocked = _blocked_sql('g."limit"', prefix)
        return (
            f'WITH gone AS (DELETE FROM {holds} WHERE run_id = ANY(%s) RETURNING "limit", "key", "tight") '  # noqa: S608
            f'SELECT g."limit", g."key", count(*), bool_or(g."tight"), {blocked} '
            'FROM gone AS g GROUP BY g."limit", g."key"'
        )
    return (
        f"DELETE FROM {holds} WHERE run_id IN (SELECT value FROM json_each(%s)) "  # noqa: S608
        'RETURNING "limit", "key", "tight"'
    )


def release(run_ids: Collection[int], *, prefix: str, along: Sequence[bulk.Statement] = ()) -> list[Freed]:
    """Delete the runs' holds; per (limit, key) they held, the slots freed, whether any was tight,
    and (where none was) whether the limit has blocked runs. Sorted by (limit, key): the order
    releases lock partitions in. ``prefix`` starts a ``held_by`` that names a limit. ``along``:
    statements written with it (the outcome's UPDATE of the runs): on PostgreSQL CTEs of its
    statement, one round trip; elsewhere run first."""
    ids = list(run_ids)
    vendor = connection.vendor
    if vendor == "postgresql":
        sql, params = _release_sql(vendor, prefix), [ids]
        if along:
            ctes = ", ".join(f"along{i} AS ({st.sql})" for i, st in enumerate(along))
            sql = f"WITH {ctes}, {sql.removeprefix('WITH ')}"
            params = [*chain.from_iterable(st.params for st in along), *params]
        rows = bulk.execute(sql, params)
        freed = [Freed(limit, key, n, bool(tight), bool(blocked)) for limit, key, n, tight, blocked in rows]
        return sorted(freed, key=lambda f: (f.limit, f.key))
    bulk.run_all(along)
    with connection.cursor() as cursor:
        cursor.execute(_release_sql(vendor, prefix), [json.dumps(ids)])
        pairs: dict[tuple[str, str], tuple[int, bool]] = {}
        for limit, key, tight in cursor.fetchall():
            n, any_tight = pairs.get((limit, key), (0, False))
            pairs[(limit, key)] = (n + 1, any_tight or bool(tight))
        out = []
        for (limit, key), (n, tight) in sorted(pairs.items()):
            blocked = False
            if not tight:
                cursor.execute(f"SELECT {_blocked_sql('%s', prefix)}", [limit, limit])
                blocked = bool(cursor.fetchone()[0])
            out.append(Freed(limit, key, n, tight, blocked))
        return out


def _live() -> str:
    """Whether hold ``h`` counts at a time (``%s``): its run leased or running at the hold's attempt,
    its lease live. A scalar subquery reading the run by its primary key (see ``live_sql``)."""
    runs = _q(Run._meta.db_table)
    leased = ", ".join(f"'{s}'" for s in LEASED_STATES)  # enum literals
    return (
        f"(SELECT r.state IN ({leased}) AND r.lease_expires_at > %s AND r.attempts = h.attempt "  # noqa: S608
        f"FROM {runs} AS r WHERE r.id = h.run_id)"
    )


@cache
def live_sql(*, by_key: bool = False, by_worker: bool = False) -> str:
    """The count of live holds of a limit (``%s``), at a time (``%s``), of a partition (``%s``),
    of a worker's runs (``%s``): ``count_live``'s statement, also a subquery of ``db.admission``'s.

    Each hold's run is read by its primary key in a scalar subquery, which the planner runs once
    per hold and never turns into a join. Written as a join, the planner (its statistics taken
    while no run was leased: autovacuum off, or a burst) estimated one leased run and one hold
    and walked every leased run's index entry for each hold: a partition of 64 holds took 0.9 ms
    (2,016 rows read and dropped) instead of 64 key lookups, on every claim."""
    holds, runs = _q(LimitHold._meta.db_table), _q(Run._meta.db_table)
    sql = f'SELECT count(*) FROM {holds} AS h WHERE h."limit" = %s AND {_live()}'  # noqa: S608 - table names
    if by_key:
        sql += ' AND h."key" = %s'
    if by_worker:
        sql += f" AND (SELECT r.lease_owner = %s FROM {runs} AS r WHERE r.id = h.run_id)"  # noqa: S608
    return sql


@cache
def live_by_stripe_sql() -> str:
    """The live holds of a limit's partition (``%s`` limit, ``%s`` time, ``%s`` key) counted per
    stripe: ``(stripe, count)`` rows, a stripe with none left out."""
    return live_sql(by_key=True).replace("SELECT count(*)", "SELECT h.stripe, count(*)", 1) + " GROUP BY h.stripe"


@cache
def one_stripe_sql() -> str:
    """Per stripe of a limit's partition, for a claim that tried one stripe's lock: ``(stripe,
    holds, live)`` rows, ``holds`` every hold row of the stripe and ``live`` those that count
    (``live_sql``'s test), looked up only for the stripe tried (``%s``; then ``%s`` the time,
    ``%s`` the limit, ``%s`` the key). A stripe with no hold is left out.

    A claim admitting under one stripe's lock needs that stripe's live holds exactly. Of the
    others it needs an upper bound only (whether the whole limit is at most half full, whether a
    stripe is over its share), and a hold row is one: a hold is deleted in the transaction that
    ends its attempt, so the rows outnumber the live holds only by leases expired and not yet
    recovered. Looking up each hold's run is most of the count's cost (a key lookup per hold, and
    a busy limit has hundreds), so it is done for the one stripe it is needed for."""
    holds = _q(LimitHold._meta.db_table)
    return (
        f"SELECT h.stripe, count(*), count(CASE WHEN h.stripe = %s THEN CASE WHEN {_live()} THEN 1 END END) "  # noqa: S608
        f'FROM {holds} AS h WHERE h."limit" = %s AND h."key" = %s GROUP BY h.stripe'
    )


def count_live(limit: str, now: datetime, *, key: str | None = None, worker_id: str | None = None) -> int:
    """Holds of the limit (of one partition, of one worker's runs) that count: their run still
    leased or running at the admitted attempt, with a live lease. A statement written once per
    shape: admission counts a partition on every claim, and through the ORM building the count
    cost more than running it."""
    params: list[Any] = [limit, connection.ops.adapt_datetimefield_value(now)]
    params += [v for v in (key, worker_id) if v is not None]
    with connection.cursor() as cursor:
        cursor.execute(live_sql(by_key=key is not None, by_worker=worker_id is not None), params)
        return int(cursor.fetchone()[0])
