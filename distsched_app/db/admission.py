"""Admission's first statement on PostgreSQL: the operators' overrides in force and the first
partition the claim admits into, locked and counted, read together.

A claim of limited runs reads the overrides once, locks each partition it admits into and counts
its holders (``services.limits.Gate``); on PostgreSQL each was a round trip before its writes.
Here the first partition is locked ``FOR UPDATE SKIP LOCKED`` in a ``LATERAL`` subquery of the
statement that reads the overrides: one round trip. The row comes back empty when another
transaction holds it (the caller then waits a bounded time, as before) or when it does not exist.

The holders are counted in the same statement, but that count is used only when it is proven
current. The statement's snapshot is taken before the lock is granted, so the count could miss
holds committed in between by the transaction the lock came free from. Every transaction that
writes holds into a partition also rewrites its row (``Gate.finish``), and a row locked under
READ COMMITTED is its latest version while a plain read of it in the same statement is the
snapshot's: if the two versions' ``xmin`` (the transaction that wrote them) are the same, no
admission into the partition committed between the snapshot and the lock, and the count saw
every hold. If they differ, the caller counts again in a statement of its own, which starts
after the lock was granted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from django.db import connection

from ..models import Limit, LimitPartition
from . import holds
from .claims import _columns, _instance, _q


@cache
def _sql() -> str:
    limits, partitions = _q(Limit._meta.db_table), _q(LimitPartition._meta.db_table)
    columns = ", ".join(f"p.{_q(f.column)}" for f in _columns(LimitPartition))
    return (
        f"SELECT (SELECT json_object_agg(l.name, l.override) FROM {limits} AS l "  # noqa: S608 - table names
        "WHERE l.override IS NOT NULL AND (l.override_until IS NULL OR l.override_until > %s)), "
        f"{columns}, p.row_xmin = (SELECT q.xmin FROM {partitions} AS q WHERE q.id = p.id), "
        f"({holds.live_sql(by_key=True)}) "
        f"FROM (SELECT 1) AS one LEFT JOIN LATERAL (SELECT *, xmin AS row_xmin FROM {partitions} "
        'WHERE "limit" = %s AND "key" = %s FOR UPDATE SKIP LOCKED) AS p ON true'
    )


def locks_rows() -> bool:
    """Whether this database locks rows (``overrides_and_partition`` is for those only)."""
    return connection.features.has_select_for_update


@dataclass(frozen=True)
class FirstLock:
    overrides: dict[str, dict[str, Any]]  # {limit: numbers} in force, as ``limits.active_overrides``
    partition: LimitPartition | None  # locked until COMMIT; None: held by another transaction, or not there
    holders: int | None  # the partition's live holds, when proven current (see the module docstring)


def overrides_and_partition(limit: str, key: str, now: datetime) -> FirstLock:
    """The overrides in force at ``now``, and the partition's row locked with its holders counted."""
    adapted = connection.ops.adapt_datetimefield_value(now)
    with connection.cursor() as cursor:
        cursor.execute(_sql(), [adapted, limit, adapted, key, limit, key])
        values, *row, current, holders = cursor.fetchone()
    if isinstance(values, str):  # Django reads json as text, as JSONField does
        values = json.loads(values)
    overrides = {name: override for name, override in (values or {}).items() if override}
    if row[0] is None:
        return FirstLock(overrides, None, None)
    return FirstLock(overrides, _instance(LimitPartition, row), int(holders) if current else None)
