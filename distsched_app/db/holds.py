"""Limit holds on the hot path: what a release frees, in as few round trips as each database allows.

Every recorded batch of outcomes under a limit deletes its runs' holds and asks whether the
limits they held have blocked runs (``services.limits.release``). On PostgreSQL that is one
statement (a ``DELETE ... RETURNING`` in a CTE, grouped, with an index probe of the blocked runs
per limit); SQLite has no data-modifying CTEs: the delete, then a probe per freed pair that was
not tight, under the write lock its transaction holds.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from functools import cache

from django.db import connection

from ..models import LimitHold, Run, RunState


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


def release(run_ids: Collection[int], *, prefix: str) -> list[Freed]:
    """Delete the runs' holds; per (limit, key) they held, the slots freed, whether any was tight,
    and (where none was) whether the limit has blocked runs. Sorted by (limit, key): the order
    releases lock partitions in. ``prefix`` starts a ``held_by`` that names a limit."""
    ids = list(run_ids)
    vendor = connection.vendor
    with connection.cursor() as cursor:
        if vendor == "postgresql":
            cursor.execute(_release_sql(vendor, prefix), [ids])
            freed = [Freed(limit, key, n, bool(tight), bool(blocked)) for limit, key, n, tight, blocked in cursor]
            return sorted(freed, key=lambda f: (f.limit, f.key))
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
