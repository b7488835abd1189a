"""The one backoff-and-retry helper for transient database errors.

A transient error is one the database will probably not make again in a
moment: the connection was lost or refused, SQLite said "database is locked",
the disk was full (``OperationalError``, ``InterfaceError``), or the driver
itself found the connection out of step with the server (psycopg's errors
without a SQLSTATE, such as ``received 2 results from command 'COMMIT'`` when
PgBouncer loses a server connection mid-transaction; Django re-raises it as
``InternalError``). The connection is closed (Django reconnects on the next
query) and the call is retried after a growing wait. Anything else is the caller's
business. Used by the worker
(claims, outcomes, registration), the tick loop and the commands, so every
loop backs off the same way.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError, connection

T = TypeVar("T")

TRANSIENT_ERRORS: tuple[type[Exception], ...] = (OperationalError, InterfaceError)


def _raised_by_the_driver(exc: BaseException) -> bool:
    """A psycopg error that no server sent (no SQLSTATE): the connection itself is in doubt."""
    psycopg = sys.modules.get("psycopg")  # loaded only where PostgreSQL is in use
    return psycopg is not None and isinstance(exc.__cause__, psycopg.Error) and exc.__cause__.sqlstate is None


def is_transient(exc: BaseException) -> bool:
    return isinstance(exc, TRANSIENT_ERRORS) or (isinstance(exc, DatabaseError) and _raised_by_the_driver(exc))


@dataclass
class Backoff:
    """Waits that double from ``initial`` up to ``maximum``; ``reset()`` after a success."""

    initial: float = 0.5
    maximum: float = 30.0
    factor: float = 2.0
    current: float = field(init=False)

    def __post_init__(self) -> None:
        self.current = self.initial

    def next_delay(self) -> float:
        delay = self.current
        self.current = min(self.current * self.factor, self.maximum)
        return delay

    def reset(self) -> None:
        self.current = self.initial


def reset_connection() -> None:
    """Close this thread's connection so the next query reconnects (not inside a transaction,
    whose owner must see its own error)."""
    try:
        if not connection.in_atomic_block:
            connection.close()
    except DatabaseError:
        pass


def retry_transient(
    fn: Callable[[], T],
    *,
    backoff: Backoff,
    give_up: Callable[[int, float], bool],
    on_retry: Callable[[BaseException, float], object] = lambda exc, delay: None,
    wait: Callable[[float], object] | None = None,
) -> T:
    """Call ``fn`` until it returns, retrying transient database errors.

    ``give_up(tries, elapsed_seconds)`` decides when to stop: the last transient
    error is then raised. ``on_retry(error, delay)`` is told before each wait
    (to log it); ``wait`` sleeps (default ``time.sleep``; a stop event's ``wait`` ends it early).
    """
    tries = 0
    start = time.monotonic()
    while True:
        try:
            return fn()
        except DatabaseError as exc:
            if not is_transient(exc):
                raise
            tries += 1
            reset_connection()
            if give_up(tries, time.monotonic() - start):
                raise
            delay = backoff.next_delay()
            on_retry(exc, delay)
            (wait or time.sleep)(delay)
