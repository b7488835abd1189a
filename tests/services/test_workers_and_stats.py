"""Worker registration, heartbeat and stale derivation; the stats summary."""

from __future__ import annotations

from datetime import timedelta

import pytest

from distsched_app.models import RunState, Worker, WorkerStatus
from distsched_app.services import claiming, outcomes, workers
from distsched_app.services.stats import stats

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
    assert [w.worker_id for w in workers.stale_workers(now=clock.now())] == ["silent"]
    silent = Worker.objects.get(worker_id="silent")
    assert workers.is_stale(silent, now=clock.now())
    assert not workers.is_stale(Worker.objects.get(worker_id="gone"), now=clock.now())


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
    outcomes.record_success(run_id=first.pk, worker_id="w", attempt=1, now=clock.now())
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
