"""An idle worker's look for chores: one statement for the leader and the bulk actions.

Between claims a worker sweeps (``limits.sweep``, ``workflow_release.sweep``) only while no
process leads, and works on operators' bulk actions when one waits. Asked apart, that is two
statements every few seconds per idle worker; at a thousand workers they cost more than the
heartbeats. ``look`` asks both in one ``SELECT`` (read-only, on the database's clock for the
lease), so a worker with nothing to do pays one round trip per look.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import connection

from ..db.leader import live_subquery
from . import bulk as bulk_service
from .leader import ROLE


@dataclass(frozen=True)
class ChoreLook:
    """What one look found: whether a live leader exists, whether a bulk action waits to be taken."""

    leader_live: bool
    bulk_waiting: bool


def look(now: datetime, role: str = ROLE) -> ChoreLook:
    """Whether ``role`` has a live leader (its lease on the database's clock) and whether an
    unfinished bulk action is free to take at ``now`` (as ``bulk.acquire`` would find one)."""
    waiting = bulk_service.free_to_take(now).order_by().values("pk")[:1]
    bulk_sql, bulk_params = waiting.query.sql_with_params()
    sql = f"SELECT EXISTS({live_subquery()}), EXISTS({bulk_sql})"
    with connection.cursor() as cursor:
        cursor.execute(sql, [role, *bulk_params])
        row = cursor.fetchone()
    return ChoreLook(leader_live=bool(row[0]), bulk_waiting=bool(row[1]))
