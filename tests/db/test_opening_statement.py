"""An enqueue that opens the caller's transaction sends its ``BEGIN`` in the same round trip
(``db.runs.execute_opening``; PostgreSQL only): psycopg must not send one of its own, and the
transaction it opens must behave as psycopg's would (open until the block ends, its isolation
level, rolled back on an error)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import DatabaseError, connection, transaction

from distsched_app.db import runs as db_runs
from distsched_app.models import Run, RunEvent
from distsched_app.services.enqueue import Job, enqueue
from tests.conftest import T0, is_postgres

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def pg() -> None:
    if not is_postgres():
        pytest.skip("PostgreSQL's pipeline")


@pytest.fixture
def own_commands(monkeypatch) -> Iterator[list[bytes]]:
    """The commands psycopg sends on its own (its ``BEGIN``, its ``COMMIT``) while the test runs."""
    connection.ensure_connection()
    conn = connection.connection
    sent: list[bytes] = []
    real = conn._exec_command

    def spy(command, *args, **kwargs):
        sent.append(bytes(command) if isinstance(command, bytes | bytearray) else str(command).encode())
        return real(command, *args, **kwargs)

    monkeypatch.setattr(conn, "_exec_command", spy)
    yield sent


def _other_sees(run_id: int) -> bool:
    """Whether a second connection sees the run (that is: it was committed)."""
    import psycopg

    params = connection.get_connection_params()
    keys = ("dbname", "user", "password", "host", "port")
    with psycopg.connect(autocommit=True, **{k: params[k] for k in keys if params.get(k)}) as other:
        return other.execute(f"SELECT 1 FROM {Run._meta.db_table} WHERE id = %s", [run_id]).fetchone() is not None


def test_an_enqueue_opening_a_transaction_sends_no_begin_of_psycopgs_own_and_the_transaction_stays_open(
    pg, own_commands
):
    from psycopg.pq import TransactionStatus

    with transaction.atomic():
        conn = connection.connection
        assert conn.pgconn.transaction_status == TransactionStatus.IDLE  # nothing sent yet
        run = enqueue(Job(task_name="tests.noop"), now=T0).run
        assert not [c for c in own_commands if c.startswith(b"BEGIN")], own_commands
        assert conn.pgconn.transaction_status == TransactionStatus.INTRANS
        assert conn.autocommit is False  # psycopg manages the transaction as before
        assert not _other_sees(run.pk)  # not committed yet
        with connection.cursor() as cursor:  # later statements run in the same transaction
            cursor.execute("SELECT now() < statement_timestamp()")
            assert cursor.fetchone() == (True,)
        second = enqueue(Job(task_name="tests.noop"), now=T0).run  # not the first: the usual path
    assert _other_sees(run.pk) and _other_sees(second.pk)
    assert RunEvent.objects.filter(run_id__in=[run.pk, second.pk], event_type="created").count() == 2


def test_an_enqueue_opening_a_transaction_is_rolled_back_with_it(pg):
    with transaction.atomic():
        run = enqueue(Job(task_name="tests.noop"), now=T0).run
        transaction.set_rollback(True)
    assert not Run.objects.filter(pk=run.pk).exists()
    assert not RunEvent.objects.filter(run_id=run.pk).exists()


def test_the_opening_begin_keeps_the_connections_isolation_level(pg):
    """``OPTIONS["isolation_level"]`` reaches psycopg as the connection's; its ``BEGIN`` says it."""
    from psycopg import IsolationLevel

    connection.ensure_connection()
    conn = connection.connection
    before = conn.isolation_level
    conn.isolation_level = IsolationLevel.SERIALIZABLE
    try:
        with transaction.atomic():
            enqueue(Job(task_name="tests.noop"), now=T0)
            with connection.cursor() as cursor:
                cursor.execute("SELECT current_setting('transaction_isolation')")
                assert cursor.fetchone() == ("serializable",)
    finally:
        conn.isolation_level = before


def test_a_failing_opening_statement_raises_djangos_error_and_the_block_rolls_back(pg):
    with pytest.raises(DatabaseError):
        with transaction.atomic():
            db_runs.execute_opening("SELECT 1 / 0", [])
    with transaction.atomic():  # the connection is usable again, in a new transaction
        assert db_runs.execute_opening("SELECT 2", []) == [(2,)]
    assert connection.connection.autocommit is True  # out of the block: Django's autocommit again


def test_an_enqueue_outside_a_transaction_commits_by_itself(pg, own_commands):
    run = enqueue(Job(task_name="tests.noop"), now=T0).run
    assert own_commands == []  # autocommit: no BEGIN, no COMMIT
    assert _other_sees(run.pk)
