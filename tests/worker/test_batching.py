"""Prefetch batches, batched successes, release on stop, threaded concurrency."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from distsched_app.models import EventType, Run, RunEvent, RunState
from distsched_app.registry import registry
from distsched_app.worker.loop import Pace
from tests.testapp import tasks as test_tasks


def events_of(run_id: int) -> list[str]:
    return list(RunEvent.objects.filter(run_id=run_id).order_by("id").values_list("event_type", flat=True))


def make_runs(scheduler, n: int, task: str = "tests.noop", **kwargs) -> None:
    for i in range(n):
        scheduler.create_schedule(name=f"b{i}", task_name=task, interval_seconds=3600, **kwargs)
    scheduler.tick()


@pytest.mark.django_db
def test_prefetched_batch_keeps_full_history_and_own_attempts(scheduler):
    make_runs(scheduler, 10)
    worker = scheduler.worker(worker_id="w", prefetch=4, heartbeat_seconds=3600)
    worker.pace.observe(0.0)  # tasks known to be quick: prefetch from the first claim
    assert worker.run(burst=True, install_signals=False) == 10
    claims = RunEvent.objects.filter(event_type=EventType.CLAIMED).order_by("id")
    # 10 runs claimed in batches of at most 4: several runs share a claim instant.
    assert claims.count() == 10 and claims.values("created_at").distinct().count() <= 4
    for run in Run.objects.all():
        assert run.state == RunState.SUCCEEDED and run.attempts == 1
        assert events_of(run.pk) == ["created", "claimed", "started", "succeeded"]
        assert run.started_at is not None and run.finished_at >= run.started_at


@pytest.mark.django_db
def test_slow_tasks_are_not_prefetched(scheduler):
    make_runs(scheduler, 3)
    worker = scheduler.worker(worker_id="w", prefetch=8, heartbeat_seconds=3600)
    worker.pace.observe(1.0)  # recent tasks were slow
    assert worker.pace.batch_size(worker.prefetch) == 1


@pytest.mark.parametrize(
    ("average", "batch"), [(0.0, 128), (0.01, 128), (0.0125, 128), (0.02, 80), (0.04, 40), (0.0499, 32), (0.05, 1)]
)
def test_a_batch_holds_at_most_batch_seconds_of_work(average, batch):
    """Workers draining one burst share it: 128 prefetched runs of 40 ms tasks would keep 5 s of it
    from the others. A batch takes at most 1.6 s of work at the recent pace (what the old default
    of 32 held at most: 32 x 50 ms), so only tasks under 12.5 ms get all of ``PREFETCH``."""
    pace = Pace()
    pace.observe(average)
    assert pace.batch_size(128) == batch
    assert pace.batch_size(128, remaining=10) == min(batch, 10)
    assert pace.batch_size(16) == min(batch, 16)


@pytest.mark.django_db
def test_heartbeat_renews_every_held_run(scheduler, clock):
    make_runs(scheduler, 3)
    worker = scheduler.worker(worker_id="w", prefetch=3, lease_seconds=10, heartbeat_seconds=3600)
    worker.held.hold(worker.loop.claim(3))
    clock.advance(seconds=8)
    worker.heartbeat()
    assert set(Run.objects.values_list("lease_expires_at", flat=True)) == {clock.now() + timedelta(seconds=10)}
    assert Run.objects.filter(state=RunState.LEASED).count() == 2


@pytest.mark.django_db
def test_stop_releases_unstarted_prefetched_runs(scheduler):
    make_runs(scheduler, 4, task="tests.hook", kwargs={"name": "stop"})
    worker = scheduler.worker(worker_id="w", prefetch=4, heartbeat_seconds=3600)
    worker.pace.observe(0.0)
    test_tasks.HOOKS["stop"] = lambda context: worker.request_stop()
    assert worker.run(install_signals=False) == 1
    assert Run.objects.filter(state=RunState.SUCCEEDED).count() == 1
    released = Run.objects.filter(state=RunState.PENDING)
    assert released.count() == 3
    for run in released:
        assert (run.attempts, run.lease_owner) == (0, "")  # the unused attempt is handed back
        assert events_of(run.pk) == ["created", "claimed", "released"]


@pytest.mark.django_db
def test_prefetched_run_cancelled_before_start_never_executes(scheduler):
    make_runs(scheduler, 2, task="tests.echo")
    worker = scheduler.worker(worker_id="w", prefetch=2, heartbeat_seconds=3600)
    first, second = worker.held.hold(worker.loop.claim(2))
    scheduler.cancel_run(second.run.pk)
    worker.heartbeat()  # learns about the cancel request
    for attempt in (first, second):
        worker.loop.call(attempt)
        worker.recorder.finish(attempt, flush=True)
    assert len(test_tasks.CALLS) == 1
    second.run.refresh_from_db()
    assert second.run.state == RunState.CANCELLED
    assert events_of(second.run.pk)[-1] == "cancelled"


@pytest.mark.django_db(transaction=True)
def test_threaded_concurrency_runs_tasks_in_parallel(scheduler):
    active = {"now": 0, "max": 0}
    lock = threading.Lock()

    def slow(context):
        with lock:
            active["now"] += 1
            active["max"] = max(active["max"], active["now"])
        time.sleep(0.2)
        with lock:
            active["now"] -= 1

    registry.register("tests.parallel", slow)
    try:
        make_runs(scheduler, 6, task="tests.parallel")
        worker = scheduler.worker(worker_id="w", concurrency=3, heartbeat_seconds=3600, poll_interval=0.05)
        assert worker.run(burst=True, install_signals=False) == 6
    finally:
        registry.unregister("tests.parallel")
    assert active["max"] >= 2
    assert Run.objects.filter(state=RunState.SUCCEEDED).count() == 6
    for run in Run.objects.all():
        assert events_of(run.pk) == ["created", "claimed", "started", "succeeded"]
