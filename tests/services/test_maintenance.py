"""Pruning: only finished runs older than the cutoff go, with their events, in batches."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from distsched_app.errors import ValidationError
from distsched_app.models import (
    ACTIVE_STATES,
    TERMINAL_STATES,
    EventType,
    LimitHold,
    Origin,
    Run,
    RunEvent,
    RunState,
    Worker,
    WorkerStatus,
)
from distsched_app.services import events, workers
from distsched_app.services.maintenance import Pacer, prune_runs
from tests.conftest import T0

pytestmark = pytest.mark.django_db

DAY = timedelta(days=1)


@pytest.fixture
def sched(make_schedule):
    return make_schedule("s1")


def make_run(schedule, state, *, finished_at=None, n_events=2):
    run = Run.objects.create(
        schedule=schedule,
        task_name=schedule.task_name,
        state=state,
        scheduled_for=T0 - 60 * DAY,
        available_at=T0 - 60 * DAY,
        finished_at=finished_at,
        origin=Origin.MANUAL,
        idempotency_key="k",
        created_at=T0 - 60 * DAY,
        updated_at=T0 - 60 * DAY,
    )
    events.record_many(
        [events.NewEvent(run_id=run.pk, event_type=EventType.CREATED, now=T0 - 60 * DAY) for _ in range(n_events)]
    )
    return run


def test_deletes_old_finished_runs_and_their_events(sched):
    old = [make_run(sched, state, finished_at=T0 - 40 * DAY) for state in TERMINAL_STATES]
    keep = make_run(sched, RunState.SUCCEEDED, finished_at=T0 - 10 * DAY)
    result = prune_runs(older_than=30 * DAY, now=T0)
    assert (result.runs, result.events, result.dry_run) == (4, 8, False)
    assert result.cutoff == T0 - 30 * DAY
    assert not Run.objects.filter(pk__in=[r.pk for r in old]).exists()
    assert list(Run.objects.values_list("pk", flat=True)) == [keep.pk]
    assert RunEvent.objects.filter(run=keep).count() == 2
    assert RunEvent.objects.count() == 2


@pytest.mark.parametrize("state", ACTIVE_STATES)
def test_never_deletes_a_non_terminal_run_however_old(sched, state):
    # Even with a (requeue-era) finished_at far in the past, an active run stays.
    run = make_run(sched, state, finished_at=T0 - 400 * DAY)
    untimed = make_run(sched, state)
    result = prune_runs(older_than=DAY, now=T0)
    assert (result.runs, result.events) == (0, 0)
    assert Run.objects.filter(pk__in=[run.pk, untimed.pk]).count() == 2
    assert RunEvent.objects.count() == 4


def test_cutoff_is_strict(sched):
    at_cutoff = make_run(sched, RunState.DEAD, finished_at=T0 - 30 * DAY)
    just_before = make_run(sched, RunState.DEAD, finished_at=T0 - 30 * DAY - timedelta(microseconds=1))
    assert prune_runs(older_than=30 * DAY, now=T0).runs == 1
    assert Run.objects.filter(pk=at_cutoff.pk).exists()
    assert not Run.objects.filter(pk=just_before.pk).exists()


def test_deletes_in_batches_each_its_own_transaction(sched):
    for _ in range(25):
        make_run(sched, RunState.SUCCEEDED, finished_at=T0 - 40 * DAY, n_events=1)
    with CaptureQueriesContext(connection) as ctx:
        result = prune_runs(older_than=30 * DAY, now=T0, batch_size=10)
    assert (result.runs, result.events, result.batches) == (25, 25, 3)
    assert Run.objects.count() == 0
    run_deletes = [
        q["sql"]
        for q in ctx.captured_queries
        if 'DELETE FROM "distsched_app_run" WHERE' in q["sql"]  # alone, or in PostgreSQL's one statement
    ]
    # PostgreSQL's one statement per batch is also the probe that finds the walk done.
    probes = 1 if connection.vendor == "postgresql" else 0
    assert len(run_deletes) == 3 + probes


@pytest.mark.postgres
def test_postgresql_deletes_a_batch_and_what_points_at_it_in_one_statement(sched):
    old = [make_run(sched, RunState.SUCCEEDED, finished_at=T0 - 40 * DAY, n_events=3) for _ in range(3)]
    keep = make_run(sched, RunState.SUCCEEDED, finished_at=T0 - 10 * DAY, n_events=2)
    workers.register_worker(worker_id="w", hostname="h", pid=1, queues=[], now=T0)
    Worker.objects.filter(worker_id="w").update(current_run=old[0])  # a stale pointer: cleared, not deleted
    with CaptureQueriesContext(connection) as ctx:
        result = prune_runs(older_than=30 * DAY, now=T0, batch_size=10)
    assert (result.runs, result.events, result.batches) == (3, 9, 1)
    writes = [q["sql"] for q in ctx.captured_queries if "DELETE FROM" in q["sql"] and 'distsched_app_run"' in q["sql"]]
    # One batch, then the statement that finds nothing left (the walk's end).
    assert len(writes) == 1 + 1
    assert all(sql.startswith("WITH doomed AS MATERIALIZED") for sql in writes)
    assert list(Run.objects.values_list("pk", flat=True)) == [keep.pk]
    assert RunEvent.objects.filter(run_id__in=[r.pk for r in old]).count() == 0
    assert RunEvent.objects.filter(run_id=keep.pk).count() == 2
    assert Worker.objects.get(worker_id="w").current_run_id is None


def test_a_delete_listener_gets_its_calls_on_either_database(sched):
    from django.db.models.signals import post_delete

    seen: list[int] = []

    def listener(sender, instance, **kwargs):
        seen.append(instance.pk)

    old = [make_run(sched, RunState.DEAD, finished_at=T0 - 40 * DAY) for _ in range(2)]
    post_delete.connect(listener, sender=Run)
    try:
        result = prune_runs(older_than=30 * DAY, now=T0)
    finally:
        post_delete.disconnect(listener, sender=Run)
    assert result.runs == 2
    assert sorted(seen) == sorted(r.pk for r in old)


def test_dry_run_counts_and_deletes_nothing(sched):
    for _ in range(3):
        make_run(sched, RunState.CANCELLED, finished_at=T0 - 40 * DAY, n_events=3)
    make_run(sched, RunState.PENDING)
    workers.register_worker(worker_id="gone", hostname="h", pid=1, queues=[], now=T0 - 40 * DAY)
    result = prune_runs(older_than=30 * DAY, now=T0, dry_run=True)
    assert (result.runs, result.events, result.workers, result.dry_run) == (3, 9, 1, True)
    assert Run.objects.count() == 4
    assert RunEvent.objects.count() == 11
    assert Worker.objects.count() == 1


def test_prunes_workers_silent_since_before_the_cutoff(sched):
    for wid, status, beat in (
        ("stopped-old", WorkerStatus.STOPPED, T0 - 40 * DAY),
        ("stopped-recent", WorkerStatus.STOPPED, T0 - DAY),
        ("vanished", WorkerStatus.ACTIVE, T0 - 40 * DAY),
        ("alive", WorkerStatus.ACTIVE, T0),
    ):
        workers.register_worker(worker_id=wid, hostname="h", pid=1, queues=[], now=beat)
        workers.set_status(worker_id=wid, status=status, now=beat)
    result = prune_runs(older_than=30 * DAY, now=T0)
    assert result.workers == 2
    assert sorted(Worker.objects.values_list("worker_id", flat=True)) == ["alive", "stopped-recent"]


def test_a_worker_pointing_at_a_pruned_run_is_kept_and_unlinked(sched):
    run = make_run(sched, RunState.SUCCEEDED, finished_at=T0 - 40 * DAY)
    workers.register_worker(worker_id="w", hostname="h", pid=1, queues=[], now=T0)
    workers.heartbeat(worker_id="w", now=T0, current_run_id=run.pk)
    prune_runs(older_than=30 * DAY, now=T0)
    assert Worker.objects.get().current_run_id is None


def test_nothing_to_prune(sched):
    result = prune_runs(older_than=DAY, now=T0)
    assert (result.runs, result.events, result.workers, result.batches) == (0, 0, 0, 0)


@pytest.mark.parametrize(
    "options",
    [
        {"older_than": timedelta(seconds=-1)},
        {"older_than": 30},
        {"older_than": DAY, "batch_size": 0},
        {"older_than": DAY, "batch_size": True},
    ],
)
def test_bad_arguments_are_validation_errors(options):
    with pytest.raises(ValidationError):
        prune_runs(now=T0, **options)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_run_locked_by_another_transaction_is_left_alone(sched):
    """A second connection holds a row lock (as a concurrent requeue would): prune skips that run."""
    from django.db import connections

    locked = make_run(sched, RunState.DEAD, finished_at=T0 - 40 * DAY)
    free = make_run(sched, RunState.DEAD, finished_at=T0 - 40 * DAY)
    other = connections.create_connection("default")
    try:
        other.set_autocommit(False)
        with other.cursor() as cursor:
            cursor.execute("SELECT id FROM distsched_app_run WHERE id = %s FOR UPDATE", [locked.pk])
        result = prune_runs(older_than=30 * DAY, now=T0)
        assert (result.runs, result.events) == (1, 2)
        assert list(Run.objects.values_list("pk", flat=True)) == [locked.pk]
        assert not Run.objects.filter(pk=free.pk).exists()
    finally:
        other.rollback()
        other.close()
    assert prune_runs(older_than=30 * DAY, now=T0).runs == 1
    assert not Run.objects.exists()


class FakeTime:
    """A monotonic clock that moves only when told (each batch "takes" ``batch`` seconds) or slept."""

    def __init__(self, batch: float) -> None:
        self.now, self.batch, self.slept = 0.0, batch, []
        self._in_batch = False

    def monotonic(self) -> float:
        if self._in_batch:  # the reading after a batch: it took ``batch`` seconds
            self.now += self.batch
        self._in_batch = not self._in_batch
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_prune_rests_after_each_batch_in_proportion_to_its_time(sched):
    for days in range(40, 45):
        make_run(sched, RunState.SUCCEEDED, finished_at=T0 - days * DAY)
    time = FakeTime(batch=0.2)
    result = prune_runs(
        older_than=30 * DAY, now=T0, batch_size=2, pause=0.5, sleep=time.sleep, monotonic=time.monotonic
    )
    assert (result.runs, result.batches) == (5, 3)
    # Three batches that deleted, the one that found nothing left, the workflows' one: every one of
    # them rested half its time, and no rest is taken inside a transaction.
    assert time.slept and all(s == pytest.approx(0.1) for s in time.slept)
    assert len(time.slept) == 3 + 1 + 1


def test_prune_walks_every_final_state_at_once_oldest_first(sched):
    """One walk by finished_at over all final states (each page visited once): the first batch takes
    the two oldest runs whatever their states, not the succeeded ones first."""
    oldest = [
        make_run(sched, RunState.DEAD, finished_at=T0 - 50 * DAY),
        make_run(sched, RunState.CANCELLED, finished_at=T0 - 49 * DAY),
    ]
    younger = [make_run(sched, RunState.SUCCEEDED, finished_at=T0 - days * DAY) for days in (48, 47, 46)]
    left_after_first_batch: list[set[int]] = []

    def after_batch(p):
        if p.batches == 1:
            left_after_first_batch.append(set(Run.objects.values_list("pk", flat=True)))

    result = prune_runs(older_than=30 * DAY, now=T0, batch_size=2, pause=0, progress=after_batch)
    assert result.runs == 5 and result.batches == 3
    assert left_after_first_batch == [{r.pk for r in younger}]
    assert not {r.pk for r in oldest} & left_after_first_batch[0]


def test_prune_without_pause_never_sleeps(sched):
    make_run(sched, RunState.SUCCEEDED, finished_at=T0 - 40 * DAY)
    time = FakeTime(batch=0.2)
    assert prune_runs(older_than=30 * DAY, now=T0, pause=0, sleep=time.sleep, monotonic=time.monotonic).runs == 1
    assert time.slept == []


def test_an_interrupted_batch_does_not_rest():
    time = FakeTime(batch=1.0)
    with pytest.raises(KeyboardInterrupt), Pacer(0.5, sleep=time.sleep, monotonic=time.monotonic):
        raise KeyboardInterrupt
    assert time.slept == []


@pytest.mark.parametrize("pause", [-0.1, 10.5, float("nan"), True, "1"])
def test_a_bad_pause_is_a_clear_error(pause):
    with pytest.raises(ValidationError, match="pause must be between 0 and 10"):
        prune_runs(older_than=DAY, now=T0, pause=pause)


@pytest.mark.postgres
def test_postgresql_prune_walks_the_finished_index_in_order_below_the_cutoff(sched):
    """The prune's one walk reads ``distsched_run_finished`` in order, bounded by the cutoff (no sort,
    no read of the retained history), the final states and workflows a filter of it."""
    from distsched_app.db import locks
    from distsched_app.services import maintenance

    for days in (40, 41):
        make_run(sched, RunState.SUCCEEDED, finished_at=T0 - days * DAY)
    qs = maintenance.prunable_runs(T0 - 30 * DAY).order_by("finished_at").filter(finished_at__gte=T0 - 45 * DAY)
    with connection.cursor() as cursor:
        # A tiny table: the planner's index path. Without a bitmap scan too, which a table this small
        # may cost below the ordered walk (then sorted) when earlier tests left statistics behind.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off")
        sql, params = locks.skip_locked(qs).values_list("pk", "finished_at")[:1000].query.sql_with_params()
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Index Scan using distsched_run_finished" in plan, plan
    assert "finished_at <" in plan and "Sort" not in plan, plan


def test_pruned_runs_take_their_limit_holds_with_them_though_the_database_does_not_enforce_the_key(sched):
    # LimitHold.run has no constraint in the database (migration 0029): the cascade is the prune's.
    old = make_run(sched, RunState.SUCCEEDED, finished_at=T0 - 40 * DAY)
    keep = make_run(sched, RunState.SUCCEEDED, finished_at=T0 - 10 * DAY)
    for run in (old, keep):
        LimitHold.objects.create(run=run, limit="one", key="", attempt=1, worker_id="w")
    assert prune_runs(older_than=30 * DAY, now=T0).runs == 1
    assert list(LimitHold.objects.values_list("run_id", flat=True)) == [keep.pk]
