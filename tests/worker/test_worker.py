"""The worker runtime with fake tasks and a fake clock (no real processes)."""

from __future__ import annotations

import logging

import pytest

from distsched_app.errors import RunCancelled
from distsched_app.models import EventType, Run, RunEvent, RunState, Worker, WorkerStatus
from distsched_app.registry import registry
from distsched_app.services.outcomes import storable_result as jsonable_result
from distsched_app.worker import describe_exception
from tests.testapp import tasks as test_tasks

pytestmark = pytest.mark.django_db


def history(run) -> list[str]:
    return list(RunEvent.objects.filter(run=run).order_by("id").values_list("event_type", flat=True))


@pytest.fixture
def worker(scheduler):
    return scheduler.worker(worker_id="w1", lease_seconds=30, heartbeat_seconds=3600)


def test_run_once_executes_task_with_args(scheduler, worker):
    scheduler.create_schedule(
        name="e", task_name="tests.echo", interval_seconds=60, args=[1, "two"], kwargs={"three": 3}
    )
    scheduler.tick()
    execution = worker.run_once()
    assert execution.state == RunState.SUCCEEDED
    assert test_tasks.CALLS == [{"args": [1, "two"], "kwargs": {"three": 3}}]
    run = Run.objects.get()
    assert run.state == RunState.SUCCEEDED
    assert run.result == {"args": [1, "two"], "kwargs": {"three": 3}}
    assert run.finished_at is not None and run.lease_owner == ""
    assert history(run) == ["created", "claimed", "started", "succeeded"]
    assert worker.run_once() is None  # never claimed again


def test_run_once_with_nothing_due_returns_none_and_registers(worker):
    assert worker.run_once() is None
    assert Worker.objects.get(worker_id="w1").status == WorkerStatus.ACTIVE


def test_context_is_passed_only_to_tasks_that_accept_it(scheduler, worker):
    scheduler.create_schedule(name="ctx", task_name="tests.context", interval_seconds=60)
    [run] = scheduler.tick()
    worker.run_once()
    context = test_tasks.CALLS[0]["context"]
    assert context.run_id == run.pk
    assert context.schedule_name == "ctx"
    assert context.worker_id == "w1"
    assert context.attempt == 1
    assert context.fencing_token == f"{run.pk}:1"
    assert context.idempotency_key == run.idempotency_key
    assert context.scheduled_for == run.scheduled_for
    assert not context.cancel_requested()


def test_failing_task_retries_then_dies(scheduler, worker, clock):
    scheduler.create_schedule(
        name="f",
        task_name="tests.fail",
        interval_seconds=3600,
        max_attempts=2,
        retry_base_seconds=5,
        kwargs={"message": "kaput"},
    )
    scheduler.tick()
    first = worker.run_once()
    assert first.state == RunState.RETRYING and first.error == "ValueError: kaput"
    run = Run.objects.get()
    assert "Traceback" in run.last_error and "kaput" in run.last_error
    assert worker.run_once() is None  # backoff not over
    clock.advance(seconds=5)
    assert worker.run_once().state == RunState.DEAD
    assert history(Run.objects.get())[-2:] == ["failed", "marked_dead"]


def test_unknown_task_is_given_back_without_using_an_attempt(scheduler, worker):
    registry.register("tests.temporary", lambda: None)
    scheduler.create_schedule(name="u", task_name="tests.temporary", interval_seconds=60, max_attempts=1)
    registry.unregister("tests.temporary")
    scheduler.tick()
    execution = worker.run_once()
    assert execution.state == RunState.PENDING
    run = Run.objects.get()
    assert (run.state, run.attempts, run.lease_owner, run.last_error) == (RunState.PENDING, 0, "", "")


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt()])
def test_system_exit_and_keyboard_interrupt_from_task_are_failures(scheduler, worker, exc):
    def bad():
        raise exc

    registry.register("tests.bad_exit", bad)
    try:
        scheduler.create_schedule(name="x", task_name="tests.bad_exit", interval_seconds=60, max_attempts=1)
        scheduler.tick()
        execution = worker.run_once()
    finally:
        registry.unregister("tests.bad_exit")
    assert execution.state == RunState.DEAD
    assert type(exc).__name__ in Run.objects.get().last_error


def test_exception_with_broken_str_is_recorded():
    class Broken(Exception):
        def __str__(self):
            raise RuntimeError("no")

    assert describe_exception(Broken()) == "Broken: <unprintable exception>"


def test_non_json_result_is_stored_as_repr():
    assert jsonable_result({1, 2}) == {"repr": "{1, 2}"}
    assert jsonable_result({"ok": [1]}) == {"ok": [1]}
    assert jsonable_result(float("nan")) == {"repr": "nan"}


def test_cooperative_cancel_seen_by_task(scheduler, worker):
    scheduler.create_schedule(name="c", task_name="tests.cancellable", interval_seconds=60, kwargs={"hook": "cancel"})
    test_tasks.HOOKS["cancel"] = lambda context: scheduler.cancel_run(context.run_id)
    scheduler.tick()
    execution = worker.run_once()
    assert execution.state == RunState.CANCELLED
    run = Run.objects.get()
    assert run.state == RunState.CANCELLED
    assert history(run)[-2:] == ["cancel_requested", "cancelled"]


def test_task_raising_run_cancelled_ends_cancelled(scheduler, worker):
    scheduler.create_schedule(name="rc", task_name="tests.raise_cancelled", interval_seconds=60)
    scheduler.tick()
    assert worker.run_once().state == RunState.CANCELLED
    assert RunCancelled.__name__ in RunEvent.objects.get(event_type=EventType.CANCELLED).message


def test_heartbeat_renews_lease_of_long_task(scheduler, clock):
    worker = scheduler.worker(worker_id="w1", lease_seconds=10, heartbeat_seconds=3600)
    rival = scheduler.worker(worker_id="w2", lease_seconds=10, heartbeat_seconds=3600)
    seen = []

    def long_task(context):
        for _ in range(4):
            clock.advance(seconds=8)  # longer than the lease in total
            worker.heartbeat()
            seen.append(rival.run_once())
        return "done"

    test_tasks.HOOKS["long"] = long_task
    scheduler.create_schedule(name="long", task_name="tests.hook", interval_seconds=3600, kwargs={"name": "long"})
    scheduler.tick()
    assert worker.run_once().state == RunState.SUCCEEDED
    assert seen == [None] * 4  # the rival never got the run
    assert EventType.LEASE_EXPIRED not in history(Run.objects.get())


def test_worker_that_stopped_heartbeating_loses_run(scheduler, clock):
    zombie = scheduler.worker(worker_id="zombie", lease_seconds=10, heartbeat_seconds=3600)
    rival = scheduler.worker(worker_id="rival", lease_seconds=10, heartbeat_seconds=3600)
    outcome = {}

    def first_execution_stalls(context):
        if context.worker_id == "zombie":
            clock.advance(seconds=11)  # no heartbeat: the lease expires...
            outcome["rival"] = rival.run_once()  # ...and the rival takes the run over
        return context.worker_id

    test_tasks.HOOKS["stall"] = first_execution_stalls
    scheduler.create_schedule(name="s", task_name="tests.hook", interval_seconds=3600, kwargs={"name": "stall"})
    scheduler.tick()
    zombie_result = zombie.run_once()
    assert outcome["rival"].state == RunState.SUCCEEDED
    assert zombie_result.state is None  # its late success was discarded
    run = Run.objects.get()
    assert (run.state, run.attempts, run.result) == (RunState.SUCCEEDED, 2, "rival")
    assert "lease_expired" in history(run) and history(run)[-1] == "lease_lost"


def test_run_with_max_runs_and_burst(scheduler, clock):
    for i in range(3):
        scheduler.create_schedule(name=f"m{i}", task_name="tests.noop", interval_seconds=60)
    scheduler.tick()
    worker = scheduler.worker(worker_id="w", heartbeat_seconds=3600)
    assert worker.run(max_runs=2, install_signals=False) == 2
    assert worker.run(burst=True, install_signals=False) == 1
    assert Worker.objects.get(worker_id="w").status == WorkerStatus.STOPPED
    assert Run.objects.filter(state=RunState.SUCCEEDED).count() == 3


def test_request_stop_finishes_current_run_and_claims_nothing_more(scheduler, clock):
    worker = scheduler.worker(worker_id="w", heartbeat_seconds=3600)
    for i in range(3):
        scheduler.create_schedule(name=f"g{i}", task_name="tests.hook", interval_seconds=60, kwargs={"name": "stop"})
    test_tasks.HOOKS["stop"] = lambda context: worker.request_stop()
    scheduler.tick()
    assert worker.run(install_signals=False) == 1
    assert Run.objects.filter(state=RunState.SUCCEEDED).count() == 1
    assert Run.objects.filter(state=RunState.PENDING).count() == 2
    assert Worker.objects.get(worker_id="w").status == WorkerStatus.STOPPED


def test_with_tick_worker_creates_and_runs(scheduler):
    scheduler.create_schedule(name="wt", task_name="tests.noop", interval_seconds=60)
    worker = scheduler.worker(worker_id="w", with_tick=True, heartbeat_seconds=3600)
    assert worker.run_once().state == RunState.SUCCEEDED


def test_logs_key_value_fields(scheduler, worker, caplog):
    scheduler.create_schedule(name="log", task_name="tests.noop", interval_seconds=60)
    scheduler.tick()
    with caplog.at_level(logging.INFO, logger="distsched"):
        worker.run_once()
    finished = next(r for r in caplog.records if r.getMessage() == "run finished")
    assert {"worker_id", "run_id", "schedule", "task", "state", "attempt", "duration"} <= set(finished.distsched)
    assert finished.distsched["state"] == "succeeded"


def test_final_status_records_runs_executed(scheduler):
    scheduler.create_schedule(name="n", task_name="tests.noop", interval_seconds=60)
    scheduler.tick()
    worker = scheduler.worker(worker_id="counted", heartbeat_seconds=3600)
    worker.run(burst=True, install_signals=False)
    assert Worker.objects.get(worker_id="counted").runs_executed == 1


def _abandoned_run(scheduler, make_schedule, clock) -> Run:
    """A run left ``running`` by a worker that died: its lease expired a second ago."""
    make_schedule("abandoned")
    [run] = scheduler.tick()
    Run.objects.filter(pk=run.pk).update(
        state=RunState.RUNNING, lease_owner="ghost", attempts=1, lease_expires_at=clock.now().replace(microsecond=0)
    )
    clock.advance(seconds=1)
    return run


def test_a_woken_claim_that_finds_nothing_still_recovers_expired_leases(scheduler, worker, make_schedule, clock):
    """Every idle claim may be woken (a notification trickle): lease recovery must not wait for a quiet one."""
    run = _abandoned_run(scheduler, make_schedule, clock)
    worker.loop.next_expired_check = 0.0  # lease recovery is due
    worker.loop.woken = True
    assert [r.pk for r in worker.loop.claim(1)] == [run.pk]
    assert "lease_expired" in history(run)


def test_a_woken_claim_skips_lease_recovery_until_it_is_due(scheduler, worker, make_schedule, clock):
    run = _abandoned_run(scheduler, make_schedule, clock)
    worker.loop.next_expired_check = float("inf")  # checked a moment ago
    worker.loop.woken = True
    assert worker.loop.claim(1) == []
    assert Run.objects.get(pk=run.pk).lease_owner == "ghost"
