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

import pytest
from django.db import connection, connections

from distsched_app.db import admission
from distsched_app.models import LimitPartition, Run, RunState
from distsched_app.services import claiming
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


def test_a_claim_whose_lock_came_free_meanwhile_counts_the_hold_committed_before(settings, monkeypatch):
    """Claim A reads its candidate, then its locking statement takes its snapshot and waits (on an
    advisory lock this test holds) before it locks the partition; meanwhile claim B takes the
    other run into the same concurrency-1 partition and commits. A must block its run."""
    if not is_postgres():
        pytest.skip("PostgreSQL's row locks and snapshots")
    if os.environ.get("DISTSCHED_REQUIRE_PGBOUNCER"):  # the gate is a session-level advisory lock
        pytest.skip("a session-level advisory lock needs one server session; transaction pooling gives none")
    settings.DISTSCHED = {**settings.DISTSCHED, "LIMITS": {"one": {"task": "tests.echo", "concurrency": 1}}}
    first = enqueue(Job(task_name="tests.echo", kwargs={}), now=T0).run
    second = enqueue(Job(task_name="tests.echo", kwargs={}), now=T0).run
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
