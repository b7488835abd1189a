"""The written claim (one statement on PostgreSQL, three prepared ones on SQLite) makes exactly
the claim the ORM path makes.

``claim_runs(include_expired=False)`` takes ``db.claims.claim_waiting`` (a woken worker's
latency path, and a draining worker's every claim but about one a second); with no
expired lease around, ``include_expired=True`` takes the ORM path on every
database. Both are run on the same rows (each inside a savepoint rolled back
afterwards) and must pick the same runs in the same order and leave the same
rows and history behind. A paused queue holds the highest-priority due run, which
neither path may take; with ``TASK_REQUIRES``, runs of ``tests.echo`` (it requires ``gpu``)
go only to a worker that has it.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from distsched_app.db import claims
from distsched_app.models import Run, RunEvent, Schedule
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
            (20, -2, "default"),  # tests.echo from here on
            (0, -8, "other"),
        ]
    ):
        enqueue(
            Job(task_name="tests.echo" if i >= 8 else "tests.noop", kwargs={"i": i}, priority=priority, queue=queue),
            now=clock.now() + timedelta(minutes=minutes),
        )
    queues.pause_queue("held", now=clock.now(), by="code:tests")


def _claimed_state(runs: list[Run]) -> tuple[list[tuple], list[tuple], list[tuple]]:
    returned = [(*(getattr(r, f) for f in RUN_FIELDS), r.schedule.name if r.schedule else None) for r in runs]
    rows = list(Run.objects.order_by("id").values_list(*RUN_FIELDS))
    history = list(RunEvent.objects.order_by("id").values_list(*EVENT_FIELDS))
    return returned, rows, history


@pytest.mark.parametrize("capabilities", [None, (), ("gpu",), ("cpu", "gpu")])
@pytest.mark.parametrize("start_all", [False, True])
@pytest.mark.parametrize("served", [None, ["default"], ["other", "default"], ["held", "default"]])
@pytest.mark.parametrize("limit", [1, 3, 20])
def test_the_waiting_claim_is_the_orm_claim(scheduler, clock, settings, limit, served, start_all, capabilities):
    """``capabilities=None``: no TASK_REQUIRES at all; otherwise tests.echo requires gpu."""
    if capabilities is not None:
        settings.DISTSCHED = {**settings.DISTSCHED, "TASK_REQUIRES": {"tests.echo": ["gpu"], "tests.none": ["tpu"]}}
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
                capabilities=capabilities or (),
            )
            outcomes[expired] = _claimed_state(runs)
            transaction.set_rollback(True)
    assert outcomes[True][0], "nothing was claimed: the rows above are not due"
    assert outcomes[False] == outcomes[True]
    assert "held" not in {run[RUN_FIELDS.index("queue")] for run in outcomes[True][0]}, "a paused queue's run"
    tasks = {run[RUN_FIELDS.index("task_name")] for run in outcomes[True][0]}
    if capabilities == ():
        assert "tests.echo" not in tasks, "a run whose task requires gpu, claimed by a worker without it"
    elif limit == 20:
        assert "tests.echo" in tasks


@pytest.mark.parametrize("expired", [True, False])  # the ORM path; the one statement on PostgreSQL
def test_neither_claim_path_gives_a_run_to_a_worker_without_its_tasks_capabilities(scheduler, clock, settings, expired):
    settings.DISTSCHED = {**settings.DISTSCHED, "TASK_REQUIRES": {"tests.echo": ["gpu", "cuda"]}}
    _runs_and_events(scheduler, clock)

    def claim(*capabilities):
        return claiming.claim_runs(
            worker_id="w1",
            queues=None,
            lease_seconds=30,
            now=clock.now(),
            limit=50,
            include_expired=expired,
            capabilities=capabilities,
        )

    assert {r.task_name for r in claim("gpu")} == {"tests.noop"}  # not all of them: only the other runs
    assert claim("gpu") == []
    assert {(r.task_name, r.priority) for r in claim("cuda", "gpu", "extra")} == {
        ("tests.echo", 20),
        ("tests.echo", 0),
    }


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


def test_claim_waiting_is_one_statement_on_postgresql_and_three_in_one_transaction_on_sqlite(
    scheduler, clock, django_assert_num_queries
):
    _runs_and_events(scheduler, clock)
    # SQLite: BEGIN IMMEDIATE, the select, the update, the events' insert, COMMIT.
    with django_assert_num_queries(1 if is_postgres() else 5):
        runs = claims.claim_waiting(
            worker_id="w", queues=None, lease_seconds=30, now=clock.now(), limit=5, start_all=False
        )
    assert [r.priority for r in runs] == [20, 10, 10, 0, 0]
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


@pytest.mark.postgres
def test_a_claim_with_excluded_tasks_still_walks_the_claim_index(scheduler, clock, settings):
    """``task_name NOT IN (...)`` is a filter on the claim index's walk, not a reason to sort."""
    settings.DISTSCHED = {**settings.DISTSCHED, "TASK_REQUIRES": {"tests.echo": ["gpu"]}}
    _runs_and_events(scheduler, clock)
    with transaction.atomic(), CaptureQueriesContext(connection) as captured:
        claims.claim_waiting(
            worker_id="w",
            queues=["default"],
            lease_seconds=30,
            now=clock.now(),
            limit=5,
            start_all=False,
            excluded_tasks=["tests.echo"],
        )
        transaction.set_rollback(True)
    (statement,) = [q["sql"] for q in captured.captured_queries]
    assert "task_name NOT IN (" in statement and "tests.echo" in statement
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_sort = off")
        cursor.execute("EXPLAIN " + statement)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        transaction.set_rollback(True)
    assert "Index Scan using distsched_run_waiting" in plan, plan
    assert "Sort Key: distsched_app_run.priority" not in plan, plan


def test_sqlite_claim_walks_the_claim_index_and_updates_by_key(scheduler, clock):
    """SQLite's written claim of a one-queue worker reads the due runs off the partial claim index
    in its order (no sort of every waiting run), and marks them by primary key (the ids bound as
    one JSON array)."""
    if is_postgres():
        pytest.skip("SQLite's statements; PostgreSQL's plan is tested above")
    _runs_and_events(scheduler, clock)
    with transaction.atomic(), CaptureQueriesContext(connection) as captured:
        claims.claim_waiting(
            worker_id="w", queues=["default"], lease_seconds=30, now=clock.now(), limit=5, start_all=False
        )
        transaction.set_rollback(True)
    select, update = [q["sql"] for q in captured.captured_queries if q["sql"].startswith(("SELECT", "UPDATE"))]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN QUERY PLAN " + select)
        plan = "\n".join(str(row[-1]) for row in cursor.fetchall())
        cursor.execute("EXPLAIN QUERY PLAN " + update)
        update_plan = "\n".join(str(row[-1]) for row in cursor.fetchall())
    assert "USING INDEX distsched_run_waiting" in plan and "ORDER BY" not in plan, plan
    assert "json_each" in update and "INTEGER PRIMARY KEY" in update_plan, update_plan


# sqlite_stat1 of the runs' indexes as ANALYZE left them at a million runs (bench/scale.py --db sqlite
# --runs 900000 --busy-hour 100000): 45,000 waiting runs, all in one queue, at one priority.
MILLION_RUN_STATS = [
    ("distsched_run_waiting", "45000 45000 45000 1 1"),
    ("distsched_run_state_queue", "1000000 166667 125000 100000"),
    ("distsched_run_state_id", "1000000 166667 1"),
    ("distsched_run_queue_id", "1000000 500000 1"),
    ("distsched_run_leased", "9000 9000 1"),
]


@pytest.mark.parametrize("queue", ["default", "idle"])
def test_sqlite_one_queue_claim_walks_the_claim_index_in_order_with_a_million_runs_statistics(scheduler, clock, queue):
    """With the statistics ANALYZE gathers on a large database, SQLite's planner skip-scanned the
    claim index over every queue and priority on the due time and sorted every due run (3.5 ms a
    claim of an idle queue, 33 ms of a queue with 45,000 due runs, at a million runs). A one-queue
    claim keeps the due time off the index: an in-order walk of the queue's prefix, no sort."""
    if is_postgres():
        pytest.skip("SQLite's planner statistics")
    _runs_and_events(scheduler, clock)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # creates sqlite_stat1
        cursor.execute("DELETE FROM sqlite_stat1 WHERE tbl = 'distsched_app_run'")
        cursor.executemany(
            "INSERT INTO sqlite_stat1 (tbl, idx, stat) VALUES ('distsched_app_run', %s, %s)", MILLION_RUN_STATS
        )
        cursor.execute("ANALYZE sqlite_schema")  # the planner reloads the statistics
        try:
            select, params = claims.waiting_statement(queues=[queue], excluded=[], now=clock.now(), limit=32)
            cursor.execute("EXPLAIN QUERY PLAN " + select, params)
            plan = "\n".join(str(row[-1]) for row in cursor.fetchall())
            several, params = claims.waiting_statement(queues=[queue, "other"], excluded=[], now=clock.now(), limit=32)
            cursor.execute(several, params)  # several queues keep the range; still a valid statement
        finally:
            cursor.execute("DELETE FROM sqlite_stat1")
            cursor.execute("ANALYZE sqlite_schema")
    assert "USING INDEX distsched_run_waiting (queue=?)" in plan, plan
    assert "available_at" not in plan and "TEMP B-TREE" not in plan, plan


def _synchronous_commit() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return str(cursor.fetchone()[0])


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("synchronous", [True, False])
def test_a_claim_in_its_own_transaction_commits_without_waiting_for_the_disk_only_when_asked(
    scheduler, clock, settings, synchronous
):
    """``SYNCHRONOUS_CLAIMS = False``: the claim's own transaction (autocommit: one statement) turns
    ``synchronous_commit`` off for itself alone; the claim it makes is the same, committed, and the
    connection's next transactions wait for the disk again."""
    settings.DISTSCHED = {**settings.DISTSCHED, "SYNCHRONOUS_CLAIMS": synchronous}
    _runs_and_events(scheduler, clock)
    with CaptureQueriesContext(connection) as captured:
        runs = claims.claim_waiting(
            worker_id="w", queues=None, lease_seconds=30, now=clock.now(), limit=5, start_all=False
        )
    (statement,) = [q["sql"] for q in captured.captured_queries]
    assert ("set_config('synchronous_commit', 'off', true)" in statement) is not synchronous
    assert [r.priority for r in runs] == [20, 10, 10, 0, 0]
    stored = dict(Run.objects.filter(pk__in=[r.pk for r in runs]).values_list("pk", "state"))
    assert stored == {r.pk: r.state for r in runs}
    assert RunEvent.objects.filter(run__in=runs, event_type="claimed", worker_id="w").count() == 5
    assert _synchronous_commit() == "on"


@pytest.mark.postgres
def test_a_claim_inside_a_callers_transaction_never_turns_synchronous_commit_off(scheduler, clock, settings):
    """The setting would hold for the caller's own writes too: inside ``atomic()`` the claim is durable."""
    settings.DISTSCHED = {**settings.DISTSCHED, "SYNCHRONOUS_CLAIMS": False}
    _runs_and_events(scheduler, clock)
    with transaction.atomic(), CaptureQueriesContext(connection) as captured:
        runs = claims.claim_waiting(
            worker_id="w", queues=None, lease_seconds=30, now=clock.now(), limit=2, start_all=False
        )
        assert _synchronous_commit() == "on"
        transaction.set_rollback(True)
    assert len(runs) == 2
    assert "set_config" not in captured.captured_queries[0]["sql"]


def test_runs_from_rows_builds_the_instances_from_db_builds_and_honours_init_receivers(scheduler, clock):
    """The claim's rows become runs (schedules cached) equal attribute for attribute to
    ``Model.from_db``'s, with the same ``_state``; with a ``post_init`` receiver for Run the
    general path is taken, so the receiver sees every claimed run."""
    from django.db.models.signals import post_init

    _runs_and_events(scheduler, clock)
    statement = claims.waiting_statement(queues=None, excluded=[], now=clock.now(), limit=20)
    with connection.cursor() as cursor:
        cursor.execute(*statement)
        rows = cursor.fetchall()
    assert any(row[claims._run_column("schedule_id")] is not None for row in rows)
    built = claims.runs_from_rows(rows)
    width = len(RUN_FIELDS)
    for run, row in zip(built, rows, strict=True):
        expected = Run.objects.select_related("schedule").get(pk=row[0])
        assert {f: getattr(run, f) for f in RUN_FIELDS} == {f: getattr(expected, f) for f in RUN_FIELDS}
        assert (run._state.adding, run._state.db) == (False, expected._state.db)
        assert type(run.args) is type(expected.args) and type(run.started_at) is type(expected.started_at)
        if run.schedule_id is None:
            assert run.schedule is None
        else:
            assert run._state.fields_cache["schedule"].pk == expected.schedule.pk == row[width]
            fields = [f.attname for f in run.schedule._meta.concrete_fields]
            assert {f: getattr(run.schedule, f) for f in fields} == {f: getattr(expected.schedule, f) for f in fields}
    seen: list[int] = []

    def receiver(sender, instance, **kwargs):
        seen.append(instance.pk)

    post_init.connect(receiver, sender=Run)  # connected after the first claim: heard all the same
    try:
        again = claims.runs_from_rows(rows)
    finally:
        post_init.disconnect(receiver, sender=Run)
    assert seen == [r.pk for r in again] == [r.pk for r in built]
    assert claims._plain(Run) and claims._plain(Schedule)  # the first claim above took the short cut
