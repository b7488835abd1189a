"""The one-statement claim (PostgreSQL) makes exactly the claim the ORM path makes.

``claim_runs(include_expired=False)`` takes ``db.claims.claim_waiting`` on
PostgreSQL (a woken worker's latency path) and the ORM elsewhere; with no
expired lease around, ``include_expired=True`` takes the ORM path on every
database. Both are run on the same rows (each inside a savepoint rolled back
afterwards) and must pick the same runs in the same order and leave the same
rows and history behind. A paused queue holds the highest-priority due run, which
neither path may take.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from distsched_app.db import claims
from distsched_app.models import Run, RunEvent
from distsched_app.services import claiming, queues
from distsched_app.services.enqueue import Job, enqueue
from tests.conftest import T0, is_postgres

pytestmark = pytest.mark.django_db

RUN_FIELDS = [f.attname for f in Run._meta.concrete_fields]
EVENT_FIELDS = ["run_id", "event_type", "message", "worker_id", "attempt", "created_at", "data"]


def _runs_and_events(scheduler, clock) -> None:
    """Due runs of several priorities, times and queues, a scheduled one, one not yet due, and the
    first in line of all in a paused queue."""
    scheduler.create_schedule(name="sched", task_name="tests.noop", interval_seconds=60, start_at=T0)
    scheduler.tick()
    for i, (priority, minutes, queue) in enumerate(
        [
            (0, -5, "default"),
            (10, -1, "default"),
            (10, -3, "default"),
            (-5, -9, "default"),
            (0, -5, "other"),
            (50, 5, "default"),
            (0, -7, "default"),
            (90, -9, "held"),
        ]
    ):
        enqueue(
            Job(task_name="tests.noop", kwargs={"i": i}, priority=priority, queue=queue),
            now=clock.now() + timedelta(minutes=minutes),
        )
    queues.pause_queue("held", now=clock.now(), by="code:tests")


def _claimed_state(runs: list[Run]) -> tuple[list[tuple], list[tuple], list[tuple]]:
    returned = [(*(getattr(r, f) for f in RUN_FIELDS), r.schedule.name if r.schedule else None) for r in runs]
    rows = list(Run.objects.order_by("id").values_list(*RUN_FIELDS))
    history = list(RunEvent.objects.order_by("id").values_list(*EVENT_FIELDS))
    return returned, rows, history


@pytest.mark.parametrize("start_all", [False, True])
@pytest.mark.parametrize("served", [None, ["default"], ["other", "default"], ["held", "default"]])
@pytest.mark.parametrize("limit", [1, 3, 20])
def test_the_waiting_claim_is_the_orm_claim(scheduler, clock, limit, served, start_all):
    _runs_and_events(scheduler, clock)
    outcomes = {}
    for expired in (True, False):  # True: the ORM path on every database
        with transaction.atomic():
            runs = claiming.claim_runs(
                worker_id="w1",
                queues=served,
                lease_seconds=30,
                now=clock.now(),
                limit=limit,
                include_expired=expired,
                start_all=start_all,
            )
            outcomes[expired] = _claimed_state(runs)
            transaction.set_rollback(True)
    assert outcomes[True][0], "nothing was claimed: the rows above are not due"
    assert outcomes[False] == outcomes[True]
    assert "held" not in {run[RUN_FIELDS.index("queue")] for run in outcomes[True][0]}, "a paused queue's run"


@pytest.mark.parametrize("expired", [True, False])  # the ORM path; the one statement on PostgreSQL
def test_neither_claim_path_takes_a_paused_queues_runs_until_it_is_resumed(scheduler, clock, expired):
    _runs_and_events(scheduler, clock)

    def claim(served):
        return claiming.claim_runs(
            worker_id="w1", queues=served, lease_seconds=30, now=clock.now(), limit=50, include_expired=expired
        )

    assert claim(["held"]) == []
    assert {r.queue for r in claim(None)} == {"default", "other"}
    queues.resume_queue("held", now=clock.now(), by="code:tests")
    [resumed] = claim(None)
    assert (resumed.queue, resumed.priority) == ("held", 90)


def test_claim_waiting_is_one_statement_on_postgresql_and_declines_elsewhere(
    scheduler, clock, django_assert_num_queries
):
    _runs_and_events(scheduler, clock)
    if not is_postgres():
        assert (
            claims.claim_waiting(
                worker_id="w", queues=None, lease_seconds=30, now=clock.now(), limit=5, start_all=False
            )
            is None
        )
        return
    with django_assert_num_queries(1):
        runs = claims.claim_waiting(
            worker_id="w", queues=None, lease_seconds=30, now=clock.now(), limit=5, start_all=False
        )
    assert [r.priority for r in runs] == [10, 10, 0, 0, 0]
    assert [r.state for r in runs] == ["running", "leased", "leased", "leased", "leased"]


@pytest.mark.postgres
def test_a_one_queue_claim_walks_the_claim_index_in_order(scheduler, clock):
    """``queue IN (...)`` as the ORM writes it, not ``= ANY(array)``: the claim reads the first
    waiting runs off the claim index instead of reading and sorting every waiting run."""
    _runs_and_events(scheduler, clock)
    with transaction.atomic(), CaptureQueriesContext(connection) as captured:
        claims.claim_waiting(
            worker_id="w", queues=["default"], lease_seconds=30, now=clock.now(), limit=5, start_all=False
        )
        transaction.set_rollback(True)
    (statement,) = [q["sql"] for q in captured.captured_queries]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # a tiny table: make the planner show its best index path
        cursor.execute("SET LOCAL enable_sort = off")
        cursor.execute("EXPLAIN " + statement)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        transaction.set_rollback(True)
    assert "Index Scan using distsched_run_waiting" in plan, plan
    assert "Sort Key: distsched_app_run.priority" not in plan, plan
    # The pause rule is a filter on that walk, the paused names read once (hashed), not an anti-join
    # that would read every waiting run first.
    assert "hashed SubPlan" in plan and "distsched_app_queuepause" in plan, plan
