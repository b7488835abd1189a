"""The one retry helper: which database errors are transient, and that it retries them."""

from __future__ import annotations

import psycopg
import pytest
from django.db import IntegrityError, InternalError, OperationalError

from distsched_app.db.retry import Backoff, is_transient, retry_transient


def _wrapped(django_error: type[Exception], driver_error: BaseException) -> Exception:
    """What Django's ``DatabaseErrorWrapper`` raises: its own class, the driver's error as the cause."""
    try:
        try:
            raise driver_error
        except Exception as cause:
            raise django_error(*cause.args) from cause
    except django_error as exc:
        return exc


def test_lost_connections_and_locked_databases_are_transient():
    assert is_transient(OperationalError("database is locked"))
    assert is_transient(_wrapped(OperationalError, psycopg.OperationalError("server closed the connection")))


def test_an_error_the_driver_raised_itself_is_transient():
    # PgBouncer losing a server connection mid-transaction leaves psycopg with a reply too many.
    desync = _wrapped(InternalError, psycopg.errors.InternalError("received 2 results from command 'COMMIT'"))
    assert is_transient(desync)


def test_errors_the_server_reported_are_not_transient():
    server_internal = psycopg.errors.InternalError_("cache lookup failed")  # SQLSTATE XX000
    assert server_internal.sqlstate == "XX000"
    assert not is_transient(_wrapped(InternalError, server_internal))
    assert not is_transient(_wrapped(IntegrityError, psycopg.errors.UniqueViolation("duplicate key")))
    assert not is_transient(InternalError("no cause at all"))
    assert not is_transient(RuntimeError("not a database error"))


def test_retry_transient_retries_a_driver_desync_and_returns():
    calls = []
    desync = _wrapped(InternalError, psycopg.errors.InternalError("received 2 results from command 'BEGIN'"))

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise desync
        return "done"

    waits: list[float] = []
    result = retry_transient(
        flaky, backoff=Backoff(initial=0.5, maximum=2), give_up=lambda tries, elapsed: tries > 5, wait=waits.append
    )
    assert result == "done"
    assert waits == [0.5, 1.0]


def test_retry_transient_raises_a_server_error_at_once():
    calls = []

    def broken() -> None:
        calls.append(1)
        raise _wrapped(IntegrityError, psycopg.errors.UniqueViolation("duplicate key"))

    with pytest.raises(IntegrityError):
        retry_transient(broken, backoff=Backoff(), give_up=lambda tries, elapsed: False, wait=lambda _: None)
    assert len(calls) == 1
