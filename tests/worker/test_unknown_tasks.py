"""Rolling deploys: a worker never spends an attempt on a run whose task it has not registered,
and what no live worker can execute (or serve) is reported."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.core.management import call_command

from distsched_app.models import EventType, Run, RunEvent, RunState, Worker
from distsched_app.registry import TaskRegistry, registry
from distsched_app.services import enqueue as enqueue_service
from distsched_app.services import explain as explain_service
from distsched_app.services import queues as queue_service
from distsched_app.services import unknown_tasks
from distsched_app.services.stats import read_snapshot

pytestmark = pytest.mark.django_db

NEW = "tests.only_in_the_new_code"
CALLED: list[int] = []


def new_task(n: int = 0) -> int:
    CALLED.append(n)
    return n


@pytest.fixture(autouse=True)
def _forget_calls():
    CALLED.clear()


def enqueue(clock, task_name: str = NEW, *, queue: str = "default", n: int = 0) -> Run:
    """A run of a task this process's registry does not have (written by the new code)."""
    known = task_name in registry
    if not known:
        registry.register(task_name, new_task)
    try:
        job = enqueue_service.Job(task_name=task_name, kwargs={} if known else {"n": n}, queue=queue)
        return Run.objects.get(pk=enqueue_service.enqueue(job, now=clock.now()).pk)
    finally:
        if not known:
            registry.unregister(task_name)


def new_registry() -> TaskRegistry:
    """The new code's registry: the old tasks and the new one."""
    reg = TaskRegistry()
    for name in registry.names():
        entry = registry.find(name)
        reg.register(name, entry.func, framework_task=entry.framework_task)
    reg.register(NEW, new_task)
    return reg


def test_release_delay_is_zero_first_then_doubles_to_a_cap():
    assert [unknown_tasks.release_delay(n) for n in range(4)] == [0.0, 1.0, 2.0, 4.0]
    assert unknown_tasks.release_delay(50) == unknown_tasks.MAX_RELEASE_DELAY_SECONDS


def test_an_old_worker_gives_the_run_back_with_its_attempt_and_a_new_worker_runs_it(scheduler, clock):
    run = enqueue(clock)
    old = scheduler.worker(worker_id="old", heartbeat_seconds=3600)
    execution = old.run_once()
    assert execution.state == RunState.PENDING
    run.refresh_from_db()
    assert (run.state, run.attempts, run.lease_owner, run.lease_expires_at) == (RunState.PENDING, 0, "", None)
    assert run.available_at == clock.now()  # the first release: claimable again at once
    event = RunEvent.objects.get(run=run, event_type=EventType.RELEASED)
    assert event.worker_id == "old" and event.data == {"reason": "unknown_task", "task": NEW}
    assert "not registered on worker old" in event.message
    assert CALLED == []
    new = scheduler.worker(worker_id="new", heartbeat_seconds=3600, registry=new_registry())
    assert new.run_once().state == RunState.SUCCEEDED
    run.refresh_from_db()
    assert (run.state, run.attempts) == (RunState.SUCCEEDED, 1)  # the first real execution is attempt 1
    assert CALLED == [0]


def test_the_old_worker_then_leaves_the_task_alone_and_runs_the_others(scheduler, clock, make_schedule):
    enqueue(clock, n=1)
    old = scheduler.worker(worker_id="old", heartbeat_seconds=3600)
    assert old.run_once().state == RunState.PENDING
    enqueue(clock, n=2)
    assert old.run_once() is None  # neither run of the unknown task is claimed again
    make_schedule("known", task_name="tests.noop")
    scheduler.tick()
    assert old.run_once().state == RunState.SUCCEEDED
    assert old.guard.skipped() == [NEW]
    assert Run.objects.filter(task_name=NEW, state=RunState.PENDING, attempts=0).count() == 2


def test_a_prefetched_batch_gives_back_only_the_unknown_runs(scheduler, clock, make_schedule):
    for n in range(3):
        make_schedule(f"known-{n}", task_name="tests.noop")
    scheduler.tick()
    unknown = enqueue(clock)
    old = scheduler.worker(worker_id="old", heartbeat_seconds=3600, prefetch=10)
    old.pace.observe(0.001)  # quick tasks: the worker claims in batches
    assert old.run(burst=True, install_signals=False) == 3
    unknown.refresh_from_db()
    assert (unknown.state, unknown.attempts) == (RunState.PENDING, 0)
    assert Run.objects.filter(state=RunState.SUCCEEDED).count() == 3


def test_released_again_it_comes_back_later_each_time(scheduler, clock):
    run = enqueue(clock)
    for n, worker_id in enumerate(["old-1", "old-2", "old-3"]):
        clock.advance(seconds=100)
        assert scheduler.worker(worker_id=worker_id, heartbeat_seconds=3600).run_once().state == RunState.PENDING
        run.refresh_from_db()
        assert run.available_at == clock.now() + timedelta(seconds=unknown_tasks.release_delay(n))
        assert run.attempts == 0


def test_lease_recovery_never_counts_a_given_back_run(scheduler, clock):
    run = enqueue(clock)
    Run.objects.filter(pk=run.pk).update(max_attempts=1)
    scheduler.worker(worker_id="old", heartbeat_seconds=3600).run_once()
    clock.advance(seconds=3600)  # long past any lease
    new = scheduler.worker(worker_id="new", heartbeat_seconds=3600, registry=new_registry())
    assert new.run_once().state == RunState.SUCCEEDED
    run.refresh_from_db()
    assert (run.attempts, run.max_attempts) == (1, 1)
    assert not RunEvent.objects.filter(run=run, event_type__in=[EventType.LEASE_EXPIRED, EventType.FAILED]).exists()


def test_the_warning_is_logged_once_per_task_name(scheduler, clock, caplog):
    enqueue(clock, n=1)
    enqueue(clock, NEW + "_too", n=2)
    enqueue(clock, n=3)
    old = scheduler.worker(worker_id="old", heartbeat_seconds=3600)
    old.guard._skipped.clear()
    with caplog.at_level(logging.WARNING, logger="distsched"):
        while old.run_once() is not None:
            old.guard._skipped.clear()  # claim the same task again: still one warning for it
    warnings = [r.getMessage() for r in caplog.records if "is not registered on this worker" in r.getMessage()]
    assert sorted(warnings) == sorted(
        f"task {name} is not registered on this worker: its runs are left to workers that have it "
        "(deploy this worker's new code, or check INSTALLED_APPS)"
        for name in (NEW, NEW + "_too")
    )


def test_workers_publish_their_task_names(scheduler):
    worker = scheduler.worker(worker_id="w", heartbeat_seconds=3600)
    worker.register()
    assert Worker.objects.get(pk="w").tasks == registry.names()


def test_explain_and_metrics_report_a_run_no_live_worker_can_execute(scheduler, clock):
    run = enqueue(clock)
    scheduler.worker(worker_id="old", heartbeat_seconds=3600).register()
    answer = explain_service.explain(run, now=clock.now())
    [reason] = answer["waiting_for"]
    assert reason["kind"] == "unknown_task" and reason["task"] == NEW and reason["queue"] == "default"
    assert answer["claimable"] is False and answer["next_possible_start"] is None
    assert read_snapshot(clock.now()).runs_with_unknown_task == 1
    scheduler.worker(worker_id="new", heartbeat_seconds=3600, registry=new_registry()).register()
    answer = explain_service.explain(run, now=clock.now())
    assert answer["waiting_for"] == [] and answer["claimable"] is True
    assert read_snapshot(clock.now()).runs_with_unknown_task == 0


def test_a_worker_that_did_not_publish_its_tasks_may_have_it(scheduler, clock):
    run = enqueue(clock)
    scheduler.worker(worker_id="old", heartbeat_seconds=3600).register()
    Worker.objects.filter(pk="old").update(tasks=None)  # a worker of a version before tasks were published
    assert explain_service.explain(run, now=clock.now())["claimable"] is True
    assert read_snapshot(clock.now()).runs_with_unknown_task == 0


def test_star_serves_every_queue(scheduler, clock):
    enqueue(clock, "tests.noop", queue="io")
    enqueue(clock, "tests.noop", queue="emails")
    worker = scheduler.worker(worker_id="all", queues=["*"], heartbeat_seconds=3600)
    assert worker.queues == []
    assert worker.run(burst=True, install_signals=False) == 2
    assert Worker.objects.get(pk="all").queues == []
    assert set(Run.objects.values_list("state", flat=True)) == {RunState.SUCCEEDED}


def test_runworker_accepts_star(clock, transactional_db):
    enqueue(clock, "tests.noop", queue="io")
    call_command("runworker", "--queues", "*", "--burst", "--worker-id", "star")
    assert Run.objects.get().state == RunState.SUCCEEDED


def test_unserved_queues_name_waiting_runs_no_live_worker_serves(scheduler, clock):
    enqueue(clock, "tests.noop", queue="io")
    enqueue(clock, "tests.noop", queue="io")
    enqueue(clock, "tests.noop", queue="reports")
    enqueue(clock, "tests.noop")
    scheduler.worker(worker_id="w", heartbeat_seconds=3600).register()  # serves "default"
    queue_service.pause_queue("reports", now=clock.now(), by="code:tests")  # waits on purpose
    assert unknown_tasks.unserved_queues(clock.now()) == {"io": 2}
    scheduler.worker(worker_id="all", queues=["*"], heartbeat_seconds=3600).register()
    assert unknown_tasks.unserved_queues(clock.now()) == {}


def test_the_worker_warns_about_unserved_queues_at_most_every_few_minutes(scheduler, clock, caplog):
    enqueue(clock, "tests.noop", queue="io")
    worker = scheduler.worker(worker_id="w", heartbeat_seconds=3600)
    worker.register()
    with caplog.at_level(logging.WARNING, logger="distsched"):
        worker.guard._next_unserved_check = 0.0
        worker.guard.maybe_warn_unserved()
        worker.guard.maybe_warn_unserved()  # rate-limited: nothing new
    lines = [r.getMessage() for r in caplog.records if "no live worker serves" in r.getMessage()]
    assert lines == [
        "runs wait in queues that no live worker serves: io (1) (start a worker with --queues NAME, or '*')"
    ]


def test_a_slow_count_is_kept_for_a_while(scheduler, clock, monkeypatch):
    from django.core.cache import cache

    from distsched_app.services import stats

    enqueue(clock)
    scheduler.worker(worker_id="old", heartbeat_seconds=3600).register()
    monkeypatch.setattr(stats, "UNKNOWN_TASK_SLOW_SECONDS", -1.0)  # every count is "slow"
    cache.delete(stats.UNKNOWN_TASK_CACHE_KEY)
    try:
        assert read_snapshot(clock.now()).runs_with_unknown_task == 1
        enqueue(clock)
        assert read_snapshot(clock.now()).runs_with_unknown_task == 1  # the cached figure
        cache.delete(stats.UNKNOWN_TASK_CACHE_KEY)
        assert read_snapshot(clock.now()).runs_with_unknown_task == 2
    finally:
        cache.delete(stats.UNKNOWN_TASK_CACHE_KEY)
