"""Timestamps read by psycopg's own loader on the cursors that read runs in bulk (PostgreSQL).

Django's psycopg backend reads every ``timestamptz`` through a Python subclass of psycopg's
loader that sets the result's zone to the connection's (``psycopg_any.register_tzloader``):
about 5 µs a value, against well under 1 µs for psycopg's own loader (C, with psycopg's binary
package), and a claimed run brings five or six of them. In a session whose ``TimeZone`` is
``UTC`` with Django's zone ``datetime.timezone.utc`` (``USE_TZ`` and no ``TIME_ZONE`` in the
database's settings: Django's defaults), psycopg's own loader returns the same values with the
same ``tzinfo`` object, so the claim's cursors use it. Anywhere else Django's loader stays.
"""

from __future__ import annotations

from datetime import timezone
from typing import Any

from django.db import connection


def _same_as_django(psycopg_connection: Any) -> bool:
    """Whether psycopg's own loader gives what Django's gives on this connection."""
    return (
        connection.timezone is timezone.utc
        and psycopg_connection.info.parameter_status("TimeZone") == "UTC"  # psycopg: datetime.timezone.utc
    )


def read_natively(cursor: Any) -> Any:
    """``cursor`` (a psycopg cursor on Django's connection, or Django's wrapper of one) reading
    ``timestamptz`` with psycopg's own loader where that gives what Django's gives; returned.
    On another database the cursor is returned as it is."""
    if connection.vendor != "postgresql":
        return cursor
    import psycopg
    from psycopg.pq import Format

    raw = getattr(cursor, "cursor", cursor)  # Django's CursorWrapper holds the psycopg cursor
    if _same_as_django(raw.connection):
        oid = psycopg.postgres.types["timestamptz"].oid
        raw.adapters.register_loader(oid, psycopg.adapters.get_loader(oid, Format.TEXT))
    return cursor
