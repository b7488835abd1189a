"""Admission's first statement on PostgreSQL: the operators' overrides in force and the first
partition the claim admits into, locked, read together.

A claim of limited runs reads the overrides once and locks each partition it admits into
(``services.limits.Gate``); on PostgreSQL each was a round trip before its writes. Here the
first partition is locked ``FOR UPDATE SKIP LOCKED`` in a ``LATERAL`` subquery of the statement
that reads the overrides: one round trip. The row comes back empty when another transaction
holds it (the caller then waits a bounded time, as before) or when it does not exist yet.

The holders are *not* counted here: the statement's snapshot is taken before the lock is
granted, so a count in it could miss holds committed by the transaction the lock was taken
from. They are counted by the next statement.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import cache
from typing import Any

from django.db import connection

from ..models import Limit, LimitPartition
from .claims import _columns, _instance, _q


@cache
def _sql() -> str:
    limits, partitions = _q(Limit._meta.db_table), _q(LimitPartition._meta.db_table)
    columns = ", ".join(f"p.{_q(f.column)}" for f in _columns(LimitPartition))
    return (
        f"SELECT (SELECT json_object_agg(l.name, l.override) FROM {limits} AS l "  # noqa: S608 - table names
        "WHERE l.override IS NOT NULL AND (l.override_until IS NULL OR l.override_until > %s)), "
        f"{columns} FROM (SELECT 1) AS one LEFT JOIN LATERAL (SELECT * FROM {partitions} "
        'WHERE "limit" = %s AND "key" = %s FOR UPDATE SKIP LOCKED) AS p ON true'
    )


def locks_rows() -> bool:
    """Whether this database locks rows (``overrides_and_partition`` is for those only)."""
    return connection.features.has_select_for_update


def overrides_and_partition(
    limit: str, key: str, now: datetime
) -> tuple[dict[str, dict[str, Any]], LimitPartition | None]:
    """The overrides in force at ``now`` (``{limit: numbers}``, as ``limits.active_overrides``)
    and the partition's row, locked until COMMIT, or None (held by another transaction, or not
    created yet)."""
    with connection.cursor() as cursor:
        cursor.execute(_sql(), [now, limit, key])
        values, *row = cursor.fetchone()
    if isinstance(values, str):  # Django reads json as text, as JSONField does
        values = json.loads(values)
    overrides = {name: override for name, override in (values or {}).items() if override}
    partition = _instance(LimitPartition, row) if row[0] is not None else None
    return overrides, partition
