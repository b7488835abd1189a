"""Admission's first statement on PostgreSQL (``db.admission``): it locks the claim's first
partition and counts its holders in one round trip, and that count is trusted only when proven
current. The race it must survive: the statement's snapshot is taken, another claim admits into
the same partition and commits, then the statement takes the (now free) lock. Its count missed
that claim's hold; trusting it would admit past the limit."""

from __future__ import annotations

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


@pytest.mark.parametrize("trust_any_count", [False, True], ids=["as-written", "count-always-trusted"])
def test_a_count_taken_before_another_claim_committed_is_not_trusted(settings, monkeypatch, trust_any_count):
    """Claim A reads its candidate, then its first statement takes its snapshot and waits (on an
    advisory lock this test holds) before it locks the partition; meanwhile claim B takes the
    other run into the same concurrency-1 partition and commits. A must block its run. The
    ``count-always-trusted`` variant shows the test can fail: trusting the stale count, A admits
    a second holder."""
    if not is_postgres():
        pytest.skip("PostgreSQL's row locks and snapshots")
    settings.DISTSCHED = {**settings.DISTSCHED, "LIMITS": {"one": {"task": "tests.echo", "concurrency": 1}}}
    first = enqueue(Job(task_name="tests.echo", kwargs={}), now=T0).run
    second = enqueue(Job(task_name="tests.echo", kwargs={}), now=T0).run
    LimitPartition.objects.create(limit="one", key="")  # there already (visible in A's snapshot)

    written = admission._sql()
    held = written.replace("FROM (SELECT 1) AS one", f"FROM (SELECT pg_advisory_xact_lock({GATE})) AS one")
    if trust_any_count:  # the statement without its proof that the count is current
        table = connection.ops.quote_name(LimitPartition._meta.db_table)
        check = f"p.row_xmin = (SELECT q.xmin FROM {table} AS q WHERE q.id = p.id)"
        assert check in held
        held = held.replace(check, "p.id IS NOT NULL")
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
    monkeypatch.setattr(admission, "_sql", lambda: held if threading.current_thread() is claimer else written)
    claimer.start()
    deadline = time.monotonic() + 30
    while not _waiting_on_gate():  # A has read its candidate and taken its statement's snapshot
        assert time.monotonic() < deadline, "claim A never reached its first statement"
        time.sleep(0.02)
    [b_run] = _claim("b", now)  # B: the other run, the partition free: admitted, committed
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock(%s)", [GATE])
    claimer.join(timeout=60)
    assert not claimer.is_alive()
    assert not isinstance(outcome["a"], BaseException), outcome["a"]

    states = dict(Run.objects.filter(pk__in=[first.pk, second.pk]).values_list("lease_owner", "state"))
    holders = Run.objects.filter(pk__in=[first.pk, second.pk], state=RunState.RUNNING).count()
    if trust_any_count:
        assert holders == 2, states  # the stale count admitted a second holder: what the check prevents
    else:
        assert b_run.pk == second.pk and outcome["a"] == [], states
        assert holders == 1 and Run.objects.get(pk=first.pk).state == RunState.BLOCKED, states
