"""Worker registration, heartbeat and stale derivation; the stats summary."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models import F

from distsched_app.db.expressions import Microseconds
from distsched_app.models import EventType, Origin, Run, RunState, Worker, WorkerStatus
from distsched_app.services import claiming, events, outcomes, workers
from distsched_app.services import enqueue as enqueue_service
from distsched_app.services.stats import run_counts, runs_by_state, runs_by_state_and_queue, stats
from tests.conftest import T0
from tests.factories import succeed

pytestmark = pytest.mark.django_db


def test_register_and_heartbeat_move_timestamps(clock):
    w = workers.register_worker(worker_id="w1", hostname="h", pid=42, queues=["default"], now=clock.now())
    assert (w.status, w.heartbeat_at, w.started_at) == (WorkerStatus.ACTIVE, clock.now(), clock.now())
    clock.advance(seconds=5)
    assert workers.heartbeat(worker_id="w1", now=clock.now())
    assert Worker.objects.get().heartbeat_at == clock.now()


def test_heartbeat_of_unknown_worker_reports_missing(clock):
    assert not workers.heartbeat(worker_id="ghost", now=clock.now())


def test_stale_workers_are_found(clock, settings):
    settings.DISTSCHED = {"STALE_AFTER_SECONDS": 30}
    for wid in ("fresh", "silent", "gone"):
        workers.register_worker(worker_id=wid, hostname="h", pid=1, queues=[], now=clock.now())
    workers.set_status(worker_id="gone", status=WorkerStatus.STOPPED, now=clock.now())
    clock.advance(seconds=31)
    workers.heartbeat(worker_id="fresh", now=clock.now())
    assert [w.worker_id for w in Worker.objects.stale(clock.now())] == ["silent"]
    silent = Worker.objects.get(worker_id="silent")
    assert silent.liveness(clock.now()) == "stale"
    assert Worker.objects.get(worker_id="gone").liveness(clock.now()) != "stale"


def test_restart_with_same_id_reactivates(clock):
    workers.register_worker(worker_id="w", hostname="h", pid=1, queues=[], now=clock.now())
    workers.set_status(worker_id="w", status=WorkerStatus.STOPPED, now=clock.now())
    clock.advance(seconds=60)
    w = workers.register_worker(worker_id="w", hostname="h", pid=2, queues=["a"], now=clock.now())
    assert (w.status, w.pid, w.queues) == (WorkerStatus.ACTIVE, 2, ["a"])


def test_stats_summarise_state(scheduler, make_schedule, clock, settings):
    settings.DISTSCHED = {"MISFIRE_GRACE_SECONDS": 60}
    make_schedule("a", max_attempts=1)
    make_schedule("b")
    make_schedule("c")
    scheduler.pause("c")
    scheduler.tick()
    first = claiming.claim_next_run(worker_id="w", queues=None, lease_seconds=30, now=clock.now())
    clock.advance(seconds=4)
    succeed(first.pk, worker_id="w", attempt=1, now=clock.now())
    second = claiming.claim_next_run(worker_id="w", queues=None, lease_seconds=30, now=clock.now())
    outcomes.record_failure(run_id=second.pk, worker_id="w", attempt=1, now=clock.now(), error="boom")
    workers.register_worker(worker_id="w", hostname="h", pid=1, queues=[], now=clock.now())
    s = stats(now=clock.now())
    assert s.runs_by_state[RunState.SUCCEEDED] == 1
    assert s.runs_by_state[RunState.DEAD] + s.runs_by_state[RunState.RETRYING] == 1
    assert (s.schedules_total, s.schedules_paused) == (3, 1)
    assert s.workers_alive == 1 and s.workers_stale == 0
    assert s.mean_duration_seconds == pytest.approx(4.0)
    assert s.failures_last_24h == 1
    assert s.recent_failures[0].message == "boom"
    # Nothing ticks for 5 minutes: the two active schedules are overdue.
    clock.advance(minutes=5)
    assert stats(now=clock.now()).schedules_overdue == 2
    assert stats(now=clock.now() + timedelta(seconds=31)).workers_stale == 1


def _run(schedule, state, *, queue="default", started_at=None, finished_at=None, origin=Origin.MANUAL):
    return Run.objects.create(
        schedule=None if origin == Origin.ENQUEUED else schedule,
        task_name=schedule.task_name,
        state=state,
        queue=queue,
        scheduled_for=T0,
        available_at=T0,
        started_at=started_at,
        finished_at=finished_at,
        origin=origin,
        idempotency_key="k",
        created_at=T0,
        updated_at=T0,
    )


def test_run_counts_are_exact_by_state_queue_and_origin(make_schedule, clock):
    a = make_schedule("a")
    for state, queue, origin, n in [
        (RunState.SUCCEEDED, "default", Origin.MANUAL, 3),
        (RunState.SUCCEEDED, "default", Origin.SCHEDULE, 1),
        (RunState.SUCCEEDED, "q2", Origin.MANUAL, 2),
        (RunState.DEAD, "q2", Origin.MANUAL, 1),
        (RunState.PENDING, "default", Origin.MANUAL, 1),
    ]:
        for _ in range(n):
            _run(a, state, queue=queue, origin=origin)
    enqueue_service.enqueue(enqueue_service.Job(task_name="tests.noop", queue="q2"), now=clock.now())
    counts = run_counts()
    assert counts == {
        (RunState.SUCCEEDED, "default", Origin.MANUAL): 3,
        (RunState.SUCCEEDED, "default", Origin.SCHEDULE): 1,
        (RunState.SUCCEEDED, "q2", Origin.MANUAL): 2,
        (RunState.DEAD, "q2", Origin.MANUAL): 1,
        (RunState.PENDING, "default", Origin.MANUAL): 1,
        (RunState.PENDING, "q2", Origin.ENQUEUED): 1,
    }
    assert runs_by_state_and_queue(counts) == {
        (RunState.SUCCEEDED, "default"): 4,
        (RunState.SUCCEEDED, "q2"): 2,
        (RunState.DEAD, "q2"): 1,
        (RunState.PENDING, "default"): 1,
        (RunState.PENDING, "q2"): 1,
    }
    by_state = runs_by_state(counts)
    assert by_state == runs_by_state()
    assert (by_state[RunState.SUCCEEDED], by_state[RunState.DEAD], by_state[RunState.PENDING]) == (6, 1, 2)
    assert by_state[RunState.SKIPPED] == 0 and sum(by_state.values()) == Run.objects.count()


def test_run_counts_cost_two_grouped_queries(make_schedule, django_assert_num_queries):
    a, b = make_schedule("a"), make_schedule("b")
    for origin in Origin.values:
        _run(a, RunState.SUCCEEDED, origin=origin)
        _run(b, RunState.PENDING, origin=origin)  # another schedule: one slot each
    with django_assert_num_queries(2):  # active, then the final states
        counts = run_counts()
    assert sum(counts.values()) == 6


@pytest.mark.parametrize(
    ("start", "end", "micros"),
    [
        (T0, T0 + timedelta(seconds=4), 4_000_000),  # whole seconds: stored without a fraction
        (T0 - timedelta(microseconds=50_000), T0 + timedelta(microseconds=50_000), 100_000),  # borrows a second
        (T0 + timedelta(microseconds=1), T0 + timedelta(microseconds=100_002), 100_001),
        (T0, T0 + timedelta(days=2, microseconds=7), 172_800_000_007),
    ],
)
def test_microseconds_is_exact_in_the_database(make_schedule, start, end, micros):
    _run(make_schedule("a"), RunState.SUCCEEDED, started_at=start, finished_at=end)
    assert Run.objects.annotate(d=Microseconds(F("finished_at"), F("started_at"))).get().d == micros


def test_recent_failures_newest_first(make_schedule):
    run = _run(make_schedule("a"), RunState.RETRYING)
    for i in range(3):
        events.record(run.pk, EventType.FAILED, message=f"boom {i}", attempt=i + 1, now=T0 + timedelta(seconds=i))
    s = stats(now=T0 + timedelta(minutes=1), recent_failures=2)
    assert [f.message for f in s.recent_failures] == ["boom 2", "boom 1"]
    assert s.failures_last_24h == 3


def test_big_terminal_counts_are_a_stored_figure_once_counting_them_is_slow(make_schedule, monkeypatch):
    """Deliberate change (issue 21): the final states' counts (dead included) are a stored figure
    (``services.figures``, shared by every process, at most 30 s old) once counting takes
    ``SLOW_SECONDS``; before, a per-process 10 s cache on PostgreSQL above 100,000 runs."""
    from distsched_app.services import figures

    a = make_schedule("a")
    for _ in range(2):
        _run(a, RunState.SUCCEEDED)
    assert run_counts(T0)[(RunState.SUCCEEDED, "default", Origin.MANUAL)] == 2  # quick: not stored
    monkeypatch.setattr(figures, "SLOW_SECONDS", 0.0)
    assert run_counts(T0)[(RunState.SUCCEEDED, "default", Origin.MANUAL)] == 2  # stored now
    _run(a, RunState.SUCCEEDED)
    _run(a, RunState.PENDING)
    counts = run_counts(T0 + timedelta(seconds=29))
    assert counts[(RunState.PENDING, "default", Origin.MANUAL)] == 1  # active: always exact
    assert counts[(RunState.SUCCEEDED, "default", Origin.MANUAL)] == 2  # the stored figure
    assert run_counts()[(RunState.SUCCEEDED, "default", Origin.MANUAL)] == 3  # no clock: exact
    assert run_counts(T0 + timedelta(seconds=30))[(RunState.SUCCEEDED, "default", Origin.MANUAL)] == 3  # aged out


def test_one_liveness_rule_for_a_row_its_row_sets_and_the_counts(clock, settings):
    settings.DISTSCHED = {"STALE_AFTER_SECONDS": 30}
    now = clock.now()
    beats = {
        "edge": now - timedelta(seconds=30),
        "just-over": now - timedelta(seconds=30, microseconds=1),
        "fresh": now,
        "stopped-long-ago": now - timedelta(days=1),
    }
    for wid, at in beats.items():
        workers.register_worker(worker_id=wid, hostname="h", pid=1, queues=[], now=at)
    workers.set_status(worker_id="stopped-long-ago", status=WorkerStatus.STOPPED, now=beats["stopped-long-ago"])
    rows = {w.worker_id: w.liveness(now) for w in Worker.objects.all()}
    assert rows == {"edge": "alive", "just-over": "stale", "fresh": "alive", "stopped-long-ago": "stopped"}
    sets = {"alive": Worker.objects.alive(now), "stale": Worker.objects.stale(now), "stopped": Worker.objects.stopped()}
    assert {name: sorted(w.worker_id for w in qs) for name, qs in sets.items()} == {
        name: sorted(w for w, live in rows.items() if live == name) for name in sets
    }
    assert Worker.objects.liveness_counts(now) == {"alive": 2, "stale": 1, "stopped": 1}
    assert sorted(Worker.objects.not_stopped().values_list("worker_id", flat=True)) == ["edge", "fresh", "just-over"]
