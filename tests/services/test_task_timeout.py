"""The ``timeout`` task option (``DISTSCHED["TASK_OPTIONS"]`` / ``@task(timeout=...)``): an attempt
that outlives it fails with ``TaskTimeout`` (a ``TimeoutError``) and is retried by the task's
policy; the worker is free again at the timeout, whatever the task does. Also: a schedule's runs
take the task's declared priority."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from distsched_app.checks import check_distsched_settings
from distsched_app.models import Run, RunState
from distsched_app.registry import registry, task
from distsched_app.services import enqueue, schedules
from distsched_app.worker.execute import TaskTimeout

pytestmark = pytest.mark.django_db

RELEASE = threading.Event()  # lets a sync task left running past its timeout end
SEEN: list[object] = []


@pytest.fixture
def tasks():
    RELEASE.clear()
    SEEN.clear()

    @task("timeouts.blocks", timeout=0.2, max_attempts=2, retry_base_seconds=0)
    def blocks(context) -> None:
        SEEN.append(threading.current_thread())
        RELEASE.wait(10)
        SEEN.append(("cancel_requested", context.cancel_requested()))

    @task("timeouts.quick", timeout=5)
    def quick(x: int) -> int:
        if x < 0:
            raise ValueError("negative")
        return x * 2

    @task("timeouts.waits", timeout=0.2)
    async def waits() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            SEEN.append("cancelled")
            raise

    yield
    RELEASE.set()
    for name in ("timeouts.blocks", "timeouts.quick", "timeouts.waits"):
        registry.unregister(name)


def run_one(scheduler, clock, task_name: str, **kwargs) -> tuple[Run, float]:
    run = enqueue.enqueue(enqueue.Job(task_name=task_name, kwargs=kwargs), now=clock.now()).run
    started = time.monotonic()
    scheduler.worker(worker_id="w", heartbeat_seconds=3600).run_once()
    took = time.monotonic() - started
    run.refresh_from_db()
    return run, took


def test_a_sync_task_past_its_timeout_fails_and_is_retried_and_the_worker_moves_on(tasks, scheduler, clock):
    run, took = run_one(scheduler, clock, "timeouts.blocks")
    assert took < 5  # the worker stopped waiting at 0.2 s; the task still blocks
    assert run.state == RunState.RETRYING and run.attempts == 1
    assert "took longer than its timeout of 0.2 s" in run.last_error
    assert "TaskTimeout" in run.last_error
    # The call goes on in its thread: released, it sees its context asking it to stop.
    thread = SEEN.pop(0)
    assert thread is not threading.current_thread() and thread.name == f"distsched-run-{run.pk}" and thread.daemon
    RELEASE.set()
    thread.join(5)
    assert SEEN == [("cancel_requested", True)]


def test_a_task_within_its_timeout_returns_or_raises_as_without_one(tasks, scheduler, clock):
    ok, _ = run_one(scheduler, clock, "timeouts.quick", x=21)
    assert (ok.state, ok.result) == (RunState.SUCCEEDED, 42)
    failed, _ = run_one(scheduler, clock, "timeouts.quick", x=-1)
    assert failed.state == RunState.RETRYING and "ValueError: negative" in failed.last_error


def test_an_async_task_past_its_timeout_is_cancelled(tasks, scheduler, clock):
    run, took = run_one(scheduler, clock, "timeouts.waits")
    assert took < 5
    assert run.state == RunState.RETRYING
    assert "took longer than its timeout of 0.2 s; cancelled" in run.last_error
    assert SEEN == ["cancelled"]


def test_the_timeout_is_a_timeout_error_for_retry_on_and_give_up_on(tasks, scheduler, clock, settings):
    assert issubclass(TaskTimeout, TimeoutError)
    settings.DISTSCHED = {"TASK_OPTIONS": {"timeouts.waits": {"give_up_on": ["builtins.TimeoutError"]}}}
    run, _ = run_one(scheduler, clock, "timeouts.waits")
    assert run.state == RunState.DEAD


def test_settings_set_a_timeout_on_a_framework_task(scheduler, clock, settings):
    from tests.testapp import upstream_tasks as up

    settings.DISTSCHED = {"TASK_OPTIONS": {"tests.testapp.upstream_tasks.sleep_for": {"timeout": 0.1}}}
    result = up.sleep_for.enqueue(1.0)
    started = time.monotonic()
    scheduler.worker(worker_id="w", heartbeat_seconds=3600).run_once()
    assert time.monotonic() - started < 0.9
    result.refresh()
    assert result.status.name == "FAILED"  # the "default" backend: MAX_ATTEMPTS 1
    assert result.errors[0].exception_class is TaskTimeout
    assert "TaskTimeout: the task took longer than its timeout of 0.1 s" in result.errors[0].traceback


def test_testing_drain_fails_a_sync_task_that_took_longer_than_its_timeout(clock):
    from distsched_app import testing

    @task("timeouts.slow_inline", timeout=0.05, max_attempts=1)
    def slow_inline() -> None:
        time.sleep(0.1)

    try:
        enqueue.enqueue(enqueue.Job(task_name="timeouts.slow_inline"), now=clock.now())
        testing.drain(clock=clock)
        run = Run.objects.get()
        assert run.state == RunState.DEAD and "timeout of 0.05 s" in run.last_error
    finally:
        registry.unregister("timeouts.slow_inline")


def check_errors(settings, options) -> list[str]:
    settings.DISTSCHED = {"TASK_OPTIONS": options}
    return [m.msg for m in check_distsched_settings(None) if m.id == "distsched.E021"]


@pytest.mark.parametrize("value", [0, -1, "5", True, 10**9, float("nan")])
def test_a_bad_timeout_is_a_system_check_error(settings, value):
    (message,) = check_errors(settings, {"opts.x": {"timeout": value}})
    assert message.startswith("DISTSCHED['TASK_OPTIONS'] 'opts.x': timeout must be")


def test_a_good_timeout_passes_the_check(settings):
    assert check_errors(settings, {"opts.x": {"timeout": 30}, "opts.y": {"timeout": 0.5}}) == []


def test_a_bad_timeout_on_the_decorator_is_a_system_check_error(settings):
    @task("timeouts.bad", timeout=-3)
    def bad() -> None:
        pass

    try:
        assert any("(@task) 'timeouts.bad': timeout must be" in m for m in check_errors(settings, {}))
    finally:
        registry.unregister("timeouts.bad")


# -- schedules follow the task's declared priority ----------------------------------------------------


FT_NOOP = "tests.testapp.tasks.ft_noop"


def test_a_schedules_runs_take_the_tasks_declared_priority(scheduler, clock, settings):
    @task("prio.urgent", priority=7)
    def urgent() -> None:
        pass

    try:
        for name, task_name in [("u", "prio.urgent"), ("f", "tests.testapp.tasks.ft_mail"), ("n", FT_NOOP)]:
            schedules.create_schedule(name=name, task_name=task_name, interval_seconds=60, now=clock.now())
        clock.advance(seconds=60)
        scheduler.tick()
        ticked = {run.schedule.name: run.priority for run in Run.objects.select_related("schedule")}
        assert ticked == {"u": 7, "f": -3, "n": 0}  # ft_mail: @task(priority=-3); ft_noop declares none
        assert scheduler.trigger("u").priority == 7
        assert Run.objects.filter(origin="manual").get().priority == 7
        settings.DISTSCHED = {"TASK_OPTIONS": {"prio.urgent": {"priority": 2}}}  # the settings win
        assert scheduler.trigger("u").priority == 2
    finally:
        registry.unregister("prio.urgent")


def test_a_framework_task_outside_tasks_py_is_found_for_its_priority(scheduler, clock):
    from tests.testapp import upstream_tasks  # registers it for the schedule's validation, in any test order

    name = upstream_tasks.urgent.module_path  # @task(priority=5), in no app's tasks module
    assert name == "tests.testapp.upstream_tasks.urgent"
    schedules.create_schedule(name="e", task_name=name, interval_seconds=60, now=clock.now())
    registry.unregister(name)  # as in a ticker that never imported the module
    clock.advance(seconds=60)
    (run,) = scheduler.tick()
    assert Run.objects.get(pk=run.pk).priority == 5
