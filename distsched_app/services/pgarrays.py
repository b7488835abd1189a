"""PostgreSQL statements that take whole columns as array parameters.

Django's psycopg backend binds parameters on the client, formatting each array
element in Python; for the tick's and the worker's bulk statements that cost
more than the database's own work. These few statements go through a
server-side-binding cursor on the same connection (and so the same
transaction) instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connection


def execute(sql: str, params: Sequence[Any]) -> list[tuple]:
    """Run one statement with server-side binding; return its rows, if any."""
    import psycopg

    connection.ensure_connection()
    # Same error types as any Django query (IntegrityError, OperationalError, ...).
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall() if cursor.description else []
