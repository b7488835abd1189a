"""SQLite: a worker's ``BEGIN IMMEDIATE`` that retries the write lock every 0.1-1 ms for a while
before it waits the ordinary way.

SQLite's busy handler (``timeout``) sleeps 1, 2, 5, 10, 15, 20, 25 ... 100 ms between tries,
however soon the lock is free. Workers take the write lock for about a millisecond per batch, so
with several on one file a waiting worker slept far longer than the lock was held: four
workers drained slower than one. This begin tries without the busy handler first.
"""

from __future__ import annotations

import time
from types import MethodType
from typing import Any

from django.db import OperationalError

# How long the short tries go on before the ordinary busy wait (the ``timeout`` option) takes over.
SPIN_SECONDS = 0.05
FIRST_DELAY, MAX_DELAY = 0.0001, 0.001


def install(connection: Any) -> None:
    """Make ``connection`` (a Django SQLite connection) begin its transactions this way."""
    if connection.vendor == "sqlite" and not getattr(connection, "_distsched_spinning_begin", False):
        connection._start_transaction_under_autocommit = MethodType(_begin, connection)
        connection._distsched_spinning_begin = True


def _begin(self: Any) -> None:
    statement = "BEGIN" if self.transaction_mode is None else f"BEGIN {self.transaction_mode}"
    raw = self.connection
    raw.execute("PRAGMA busy_timeout = 0")
    try:
        deadline, delay = time.monotonic() + SPIN_SECONDS, FIRST_DELAY
        while True:
            try:
                self.cursor().execute(statement)
                return
            except OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    break
            time.sleep(delay)
            delay = min(2 * delay, MAX_DELAY)
    finally:
        raw.execute(f"PRAGMA busy_timeout = {int(self.settings_dict['OPTIONS'].get('timeout', 5) * 1000)}")
    self.cursor().execute(statement)
