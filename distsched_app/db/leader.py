"""The leader row's statements, every instant on the database's clock.

PostgreSQL reads ``now()`` (the transaction's start); SQLite, a file on this
machine, reads its own ``strftime(..., 'now')``, written in one format
('YYYY-MM-DD HH:MM:SS.SSS', UTC) so that its values compare as text. No
process clock decides a lease, so a ticker whose clock is wrong cannot
extend or steal one. Each function is one statement (one transaction in
autocommit, or part of the caller's): nothing lives in the session, so all
of it works behind PgBouncer in transaction mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from django.db import connection

from ..leader_models import Leader
from . import bulk

_SQLITE_FORMAT = "'%%Y-%%m-%%d %%H:%%M:%%f'"


@dataclass(frozen=True)
class Term:
    """A lease won: who holds it, under which term, and the database's instants."""

    role: str
    holder: str
    term: int
    since: datetime
    expires_at: datetime


def _now() -> str:
    if connection.vendor == "postgresql":
        return "now()"
    return f"strftime({_SQLITE_FORMAT}, 'now')"


def _later() -> str:
    """now() plus the bound number of seconds (one ``%s`` parameter)."""
    if connection.vendor == "postgresql":
        return "now() + make_interval(secs => %s)"
    return f"strftime({_SQLITE_FORMAT}, 'now', '+' || %s || ' seconds')"


def _datetime(value: object) -> datetime:
    """A RETURNING column: PostgreSQL gives a datetime, SQLite the text it wrote."""
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)
    return datetime.fromisoformat(str(value)).replace(tzinfo=timezone.utc)


def take_over(role: str, *, holder: str, pid: int, host: str, lease_seconds: float) -> Term | None:
    """Become the holder if the lease has expired (or was given up): term + 1. None if it is held.

    An UPDATE that matches no row writes nothing and locks nothing, so a standby's try
    costs one short statement.
    """
    sql = (
        f"UPDATE {bulk.table(Leader)} SET holder = %s, pid = %s, host = %s, term = term + 1,"  # noqa: S608 - a table name and SQL functions
        f" since = {_now()}, expires_at = {_later()}"
        f" WHERE role = %s AND expires_at <= {_now()} RETURNING term, since, expires_at"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [holder, pid, host, lease_seconds, role])
        row = cursor.fetchone()
    return None if row is None else Term(role, holder, int(row[0]), _datetime(row[1]), _datetime(row[2]))


def create(role: str, *, holder: str, pid: int, host: str, lease_seconds: float) -> Term | None:
    """The first election of a role: insert its row at term 1. None if it exists already."""
    sql = (
        f"INSERT INTO {bulk.table(Leader)} (role, holder, pid, host, term, since, expires_at)"  # noqa: S608 - a table name and SQL functions
        f" VALUES (%s, %s, %s, %s, 1, {_now()}, {_later()})"
        " ON CONFLICT (role) DO NOTHING RETURNING term, since, expires_at"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [role, holder, pid, host, lease_seconds])
        row = cursor.fetchone()
    return None if row is None else Term(role, holder, int(row[0]), _datetime(row[1]), _datetime(row[2]))


def renew(term: Term, *, lease_seconds: float) -> datetime | None:
    """Extend a lease still held under this term: the new expiry, or None if it was lost
    (expired, or another holder's term). Scoped by holder and term, never by role alone."""
    sql = (
        f"UPDATE {bulk.table(Leader)} SET expires_at = {_later()}"  # noqa: S608 - a table name and SQL functions
        f" WHERE role = %s AND holder = %s AND term = %s AND expires_at > {_now()} RETURNING expires_at"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [lease_seconds, term.role, term.holder, term.term])
        row = cursor.fetchone()
    return None if row is None else _datetime(row[0])


def give_up(term: Term) -> bool:
    """Step down cleanly: the lease expires now, so a standby takes over at its next try."""
    sql = (
        f"UPDATE {bulk.table(Leader)} SET expires_at = {_now()}"  # noqa: S608 - a table name and SQL functions
        f" WHERE role = %s AND holder = %s AND term = %s AND expires_at > {_now()}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [term.role, term.holder, term.term])
        return cursor.rowcount > 0


def holds(term: Term) -> bool:
    """Inside the caller's transaction: whether this term still leads, by the database's clock.

    On PostgreSQL the row is locked ``FOR SHARE`` until the caller commits, so a takeover
    (an UPDATE of that row) waits for the leader's transaction to end: the leader's writes
    and a successor's never interleave. On SQLite the caller's ``BEGIN IMMEDIATE`` already
    excludes every other writer.
    """
    lock = " FOR SHARE" if connection.vendor == "postgresql" else ""
    sql = (
        f"SELECT 1 FROM {bulk.table(Leader)}"  # noqa: S608 - a table name and SQL functions
        f" WHERE role = %s AND holder = %s AND term = %s AND expires_at > {_now()}{lock}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [term.role, term.holder, term.term])
        return cursor.fetchone() is not None


def live_subquery() -> str:
    """``SELECT 1`` when the role's lease is live by the database's clock (one ``%s``: the role),
    for a caller to embed in an ``EXISTS`` of a statement of its own (``services.chore_look``)."""
    return f"SELECT 1 FROM {bulk.table(Leader)} WHERE role = %s AND expires_at > {_now()}"  # noqa: S608 - a table name and SQL functions


def live(role: str) -> tuple[Leader, bool] | None:
    """The role's row and whether its lease is live by the database's clock; None if never elected."""
    sql = (
        f"SELECT role, holder, pid, host, term, since, expires_at, expires_at > {_now()}"  # noqa: S608 - a table name and SQL functions
        f" FROM {bulk.table(Leader)} WHERE role = %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [role])
        row = cursor.fetchone()
    if row is None:
        return None
    leader = Leader(
        role=row[0],
        holder=row[1],
        pid=row[2],
        host=row[3],
        term=int(row[4]),
        since=_datetime(row[5]),
        expires_at=_datetime(row[6]),
    )
    return leader, bool(row[7])
