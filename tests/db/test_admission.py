"""Admission's lock on PostgreSQL (``db.admission``): a partition locked and its holders counted
in one round trip. The race it must survive: the locking statement's snapshot is taken, another
claim admits into the same partition and commits, then the statement takes the (now free) lock.
A count in that statement's snapshot would miss the other claim's hold and admit past the limit
(the earlier design's warning; seen with a count inside the locking statement); the count is a
statement of its own, pipelined after the lock, so it sees the hold."""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction

from distsched_app.db import admission, claims
from distsched_app.models import LimitPartition, Run, RunState
from distsched_app.services import claiming, limits, outcomes
from distsched_app.services.enqueue import Job, enqueue
from tests.conftest import T0, is_postgres

pytestmark = pytest.mark.django_db(transaction=True)

GATE = 461_733  # the advisory lock this test holds the first statement on


def _claim(worker_id: str, now) -> list[Run]:
    return claiming.claim_runs(
        worker_id=worker_id, queues=None, lease_seconds=60, now=now, limit=1, include_expired=False
    )


def _waiting_on_gate() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s AND NOT granted", [GATE]
        )
        return cursor.fetchone()[0] > 0


@pytest.mark.parametrize("expected", [False, True], ids=["locked-when-needed", "locked-with-the-candidates"])
def test_a_claim_whose_lock_came_free_meanwhile_counts_the_hold_committed_before(settings, monkeypatch, expected):
    """Claim A reads its candidate, then its locking statement takes its snapshot and waits (on an
    advisory lock this test holds) before it locks the partition; meanwhile claim B takes the
    other run into the same concurrency-1 partition and commits. A must block its run.
    ``expected``: A's previous claim admitted into the partition, so A locks it in the round
    trip that reads its candidate (``Gate.pick``), not after."""
    if not is_postgres():
        pytest.skip("PostgreSQL's row locks and snapshots")
    if os.environ.get("DISTSCHED_REQUIRE_PGBOUNCER"):  # the gate is a session-level advisory lock
        pytest.skip("a session-level advisory lock needs one server session; transaction pooling gives none")
    settings.DISTSCHED = {**settings.DISTSCHED, "LIMITS": {"one": {"task": "tests.echo", "concurrency": 1}}}
    if expected:  # A admits a run into the partition and finishes it: its next claim expects the partition
        earlier = enqueue(Job(task_name="tests.echo", kwargs={}), now=T0 - timedelta(seconds=1)).run
        [taken] = _claim("a", T0)
        assert taken.pk == earlier.pk
        outcomes.record_successes(
            worker_id="a",
            successes=[outcomes.Success(run_id=taken.pk, attempt=taken.attempts, started_at=T0, finished_at=T0)],
            now=T0,
        )
        assert limits._expected["a"][1] == (("one", ""),)
    picks: list[object] = []
    real_pick = admission.pick_and_lock
    monkeypatch.setattr(
        admission, "pick_and_lock", lambda pick, *a, **k: picks.append(pick and a[0]) or real_pick(pick, *a, **k)
    )
    first = enqueue(Job(task_name="tests.echo", kwargs={}), now=T0).run
    second = enqueue(Job(task_name="tests.echo", kwargs={}), now=T0).run
    if not expected:
        LimitPartition.objects.create(limit="one", key="")  # there already (visible in A's snapshot)

    written = admission._lock_sql(True)
    held = written.replace("FROM (SELECT 1) AS one", f"FROM (SELECT pg_advisory_xact_lock({GATE})) AS one")
    assert held != written
    now = T0.replace(second=5)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [GATE])
    outcome: dict[str, object] = {}

    def claim_a() -> None:
        try:
            outcome["a"] = _claim("a", now)
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            outcome["a"] = exc
        finally:
            connections.close_all()

    claimer = threading.Thread(target=claim_a)  # claim A: its own thread, its own connection
    monkeypatch.setattr(
        admission, "_lock_sql", lambda overrides: held if threading.current_thread() is claimer else written
    )
    claimer.start()
    deadline = time.monotonic() + 30
    while not _waiting_on_gate():  # A has read its candidate and taken its statement's snapshot
        assert time.monotonic() < deadline, "claim A never reached its locking statement"
        time.sleep(0.02)
    [b_run] = _claim("b", now)  # B: the other run, the partition free: admitted, committed
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock(%s)", [GATE])
    claimer.join(timeout=60)
    assert not claimer.is_alive()
    assert not isinstance(outcome["a"], BaseException), outcome["a"]

    states = dict(Run.objects.filter(pk__in=[first.pk, second.pk]).values_list("lease_owner", "state"))
    assert b_run.pk == second.pk and outcome["a"] == [], states
    assert Run.objects.get(pk=first.pk).state == RunState.BLOCKED, states
    assert Run.objects.filter(pk__in=[first.pk, second.pk], state=RunState.RUNNING).count() == 1, states
    # A's candidate and its lock went in one pipeline exactly when A expected the partition.
    assert any(picks) is expected


def test_a_claim_locks_with_its_candidates_the_partitions_its_previous_claim_admitted_into(settings, monkeypatch):
    """A worker's next claim expects the partitions its last claim admitted into (one round trip
    for candidates and locks); a claim that admitted into none makes it forget them."""
    if not is_postgres():
        pytest.skip("PostgreSQL's row locks")
    settings.DISTSCHED = {**settings.DISTSCHED, "LIMITS": {"five": {"task": "tests.echo", "concurrency": 5}}}
    picks: list[object] = []
    real_pick = admission.pick_and_lock
    monkeypatch.setattr(
        admission, "pick_and_lock", lambda pick, *a, **k: picks.append(pick and a[0]) or real_pick(pick, *a, **k)
    )

    def claim_one(task: str) -> tuple[int, bool]:
        run = enqueue(Job(task_name=task, kwargs={}), now=T0).run
        picks.clear()
        [claimed] = _claim("w-expect", T0.replace(second=5))
        assert claimed.pk == run.pk
        return claimed.pk, any(picks)

    assert claim_one("tests.echo")[1] is False  # nothing expected yet: locked when the candidate needed it
    assert limits._expected["w-expect"][1] == (("five", ""),)
    assert claim_one("tests.echo")[1] is True
    assert claim_one("tests.noop")[1] is True  # still expected; admitted into nothing
    assert limits._expected["w-expect"][1] == ()
    assert claim_one("tests.noop")[1] is False
    # A partitioned limit's partition is not expected: the next run is as likely in another one.
    settings.DISTSCHED = {
        **settings.DISTSCHED,
        "LIMITS": {"per-key": {"task": "tests.echo", "concurrency": 5, "partition_by": ["k"], "missing": "shared"}},
    }
    assert claim_one("tests.echo")[1] is False
    assert limits._expected["w-expect"][1] == ()


def test_candidates_picked_with_a_lock_not_granted_in_time_are_kept_and_the_lock_is_not():
    """``pick_and_lock``: when an expected partition is locked elsewhere past the timeout, the
    candidates read in the same round trip are returned and stay locked by this transaction (their
    locks came before the savepoint), no partition is reported locked, and the connection goes on
    with its usual lock timeout."""
    if not is_postgres():
        pytest.skip("PostgreSQL's row locks")
    import psycopg

    run = enqueue(Job(task_name="tests.echo", kwargs={}), now=T0).run
    LimitPartition.objects.create(limit="one", key="")
    params = connection.get_connection_params()
    other = psycopg.connect(**{k: params[k] for k in ("dbname", "user", "password", "host", "port") if params.get(k)})
    partitions, runs = LimitPartition._meta.db_table, Run._meta.db_table
    try:
        other.execute(f'SELECT 1 FROM {partitions} WHERE "limit" = %s FOR UPDATE', ["one"])
        with transaction.atomic():
            statement = claims.waiting_statement(queues=None, excluded=[], now=T0.replace(second=5), limit=5)
            rows, locked = admission.pick_and_lock(statement, [("one", "")], T0, timeout_ms=50, overrides=True)
            assert locked is None and [r[0] for r in rows] == [run.pk]
            skipped = other.execute(f"SELECT id FROM {runs} WHERE id = %s FOR UPDATE SKIP LOCKED", [run.pk])
            assert skipped.fetchall() == []  # still locked by this transaction
            with connection.cursor() as cursor:
                cursor.execute("SHOW lock_timeout")
                assert cursor.fetchone()[0] == "0"
    finally:
        other.rollback()
        other.close()


def test_the_first_pipeline_of_a_transaction_opens_it_and_its_locks_last_until_the_end():
    """A claim's first statements are its pipeline, which sends the ``BEGIN`` itself (no round
    trip of psycopg's own): the transaction it opens must stay open after the pipeline's sync,
    holding what it locked (a candidate run, a stripe) until the claim ends, and psycopg must
    be left managing the transaction as before."""
    if not is_postgres():
        pytest.skip("PostgreSQL's pipeline")
    import psycopg
    from psycopg.pq import TransactionStatus

    run = enqueue(Job(task_name="tests.echo", kwargs={}), now=T0).run
    params = connection.get_connection_params()
    other = psycopg.connect(
        autocommit=True, **{k: params[k] for k in ("dbname", "user", "password", "host", "port") if params.get(k)}
    )
    lock_key = admission.stripe_lock_key("wide", "")
    runs = Run._meta.db_table
    try:
        with transaction.atomic():
            conn = connection.connection
            assert conn.pgconn.transaction_status == TransactionStatus.IDLE  # nothing sent yet
            statement = claims.waiting_statement(queues=None, excluded=[], now=T0.replace(second=5), limit=5)
            rows, locked = admission.pick_and_lock(
                statement, [("wide", "")], T0, timeout_ms=50, stripes={("wide", ""): 3}
            )
            assert [r[0] for r in rows] == [run.pk] and locked is not None
            assert locked[("wide", "")].stripe == 3
            assert conn.pgconn.transaction_status == TransactionStatus.INTRANS
            assert conn.autocommit is False
            held = other.execute("SELECT pg_try_advisory_xact_lock(%s, 3)", [lock_key]).fetchone()[0]
            assert held is False  # the stripe is still this transaction's
            skipped = other.execute(f"SELECT id FROM {runs} WHERE id = %s FOR UPDATE SKIP LOCKED", [run.pk])
            assert skipped.fetchall() == []  # and so is the candidate
            with connection.cursor() as cursor:  # later statements run in the same transaction
                cursor.execute("SELECT now() < statement_timestamp()")  # began before this statement
                assert cursor.fetchone() == (True,)
        assert other.execute("SELECT pg_try_advisory_lock(%s, 3)", [lock_key]).fetchone()[0] is True
        other.execute("SELECT pg_advisory_unlock(%s, 3)", [lock_key])
    finally:
        other.close()
