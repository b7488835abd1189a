"""A worker's SQLite ``BEGIN IMMEDIATE`` (``db.sqlite_begin``): short tries while another
connection holds the write lock, then the transaction; the busy timeout is put back."""

from __future__ import annotations

import sqlite3
import threading

import pytest
from django.db import connection, transaction

from distsched_app.db import sqlite_begin

pytestmark = pytest.mark.django_db(transaction=True)


def _busy_timeout() -> int:
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA busy_timeout")
        return cursor.fetchone()[0]


def test_a_begin_waits_out_a_short_hold_and_restores_the_busy_timeout():
    if connection.vendor != "sqlite":
        pytest.skip("SQLite-only")
    connection.ensure_connection()
    sqlite_begin.install(connection)
    before = _busy_timeout()
    other = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    release = threading.Timer(0.02, other.execute, args=["COMMIT"])
    release.start()
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    finally:
        release.join()
        other.close()
    assert _busy_timeout() == before > 0


def test_other_errors_are_not_retried():
    if connection.vendor != "sqlite":
        pytest.skip("SQLite-only")
    connection.ensure_connection()
    sqlite_begin.install(connection)
    with pytest.raises(Exception, match="within a transaction"), transaction.atomic():
        connection._start_transaction_under_autocommit()
