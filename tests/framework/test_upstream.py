"""Conformance glue: the behaviours of Django's own ``tests/tasks`` suite and of the ``django-tasks``
backport's backend tests, re-stated against ``DistschedBackend``.

Their tests target the reference backends (``ImmediateBackend`` runs a task inside ``enqueue``,
``DummyBackend`` never runs it); each test here names the upstream test it mirrors (Django 6.0
``tests/tasks/test_immediate_backend.py`` / ``test_tasks.py``, the same names in the backport's
``tests/tests/``) and asserts what that test asserts, with ``finish`` standing in for "the task
has run": a worker pass in this process, then ``refresh()``. Where our backend differs by design
(a worker, not the caller, runs the task), the test says so and pins what we do instead; the
docs page ``docs/howto/django-tasks.md`` lists the differences. Tests of the reference backends'
own models, commands and admin are not applicable and not re-stated.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re

import pytest
from asgiref.sync import async_to_sync
from django.test import override_settings

from distsched_app import framework
from distsched_app.models import Run, RunState
from tests.testapp import upstream_tasks as up

pytestmark = pytest.mark.django_db

LOGGER = framework.SOURCE  # "django.tasks" (Django 6) or "django_tasks" (the backport)
Status = framework.TaskResultStatus


@pytest.fixture
def worker(scheduler):
    return scheduler.worker(worker_id="upstream", heartbeat_seconds=3600)


@pytest.fixture
def finish(worker):
    def run(result):
        while worker.run_once() is not None:
            pass
        result.refresh()
        return result

    return run


def assert_finished_times(result) -> None:
    assert result.is_finished is True
    assert None not in (result.started_at, result.last_attempted_at, result.finished_at)
    assert result.started_at >= result.enqueued_at
    assert result.finished_at >= result.started_at


# -- test_immediate_backend.py -----------------------------------------------------------------------


def test_using_correct_backend():
    # ImmediateBackendTestCase.test_using_correct_backend: alias and options as configured.
    backend = framework.task_backends["default"]
    assert framework.default_task_backend.alias == backend.alias == "default"
    assert backend.options == {"MAX_ATTEMPTS": 1}  # tests/settings.py
    assert backend.supports_get_result and backend.supports_defer and backend.supports_async_task


@pytest.mark.parametrize("task", [up.noop, up.noop_async], ids=["sync", "async"])
def test_enqueue_task(task, finish):
    # test_enqueue_task: SUCCESSFUL, times in order, no return value, the same task, JSON arguments.
    result = finish(task.enqueue(1, two=3))
    assert result.status == Status.SUCCESSFUL
    assert_finished_times(result)
    assert result.return_value is None
    assert result.task == task
    assert (result.args, result.kwargs, result.attempts) == ([1], {"two": 3}, 1)


@pytest.mark.parametrize("task", [up.noop, up.noop_async], ids=["sync", "async"])
def test_enqueue_task_async(task, finish):
    # test_enqueue_task_async: the same through aenqueue.
    result = finish(async_to_sync(task.aenqueue)())
    assert result.status == Status.SUCCESSFUL
    assert_finished_times(result)
    assert (result.task, result.args, result.kwargs, result.attempts) == (task, [], {}, 1)


@pytest.mark.parametrize(
    ("task", "exception", "message"),
    [
        (up.fails_with_value_error, ValueError, "This Task failed due to ValueError"),
        (up.fails_with_system_exit, SystemExit, "This Task failed due to SystemExit"),
    ],
)
def test_catches_exception(task, exception, message, finish, caplog):
    # test_catches_exception: one ERROR line of the framework's logger naming the error; the result
    # FAILED, no return value, the exception class and a traceback ending with the message.
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        result = finish(task.enqueue())
    errors = [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert message in caplog.text
    assert result.status == Status.FAILED
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value
    assert_finished_times(result)
    assert result.errors[0].exception_class is exception
    assert result.errors[0].traceback.endswith(f"{exception.__name__}: {message}\n")
    assert (result.task, result.args, result.kwargs) == (task, [], {})


def test_throws_keyboard_interrupt(worker, finish):
    # test_throws_keyboard_interrupt: DIFFERS BY DESIGN. The immediate backend runs the task in the
    # caller, so a KeyboardInterrupt reaches the caller. Our worker runs it: the task's own
    # KeyboardInterrupt fails that run (traceback kept) and the worker goes on serving.
    result = finish(up.fails_with_keyboard_interrupt.enqueue())
    assert result.status == Status.FAILED
    assert result.errors[0].exception_class is KeyboardInterrupt
    after = finish(up.meaning_of_life.enqueue())
    assert after.return_value == 42


def test_complex_exception(finish, caplog):
    # test_complex_exception: an exception whose argument is an exception keeps its repr in the traceback.
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        result = finish(up.raises_complex_exception.enqueue())
    assert any(r.name == LOGGER and r.levelno >= logging.ERROR for r in caplog.records)
    assert result.status == Status.FAILED
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value
    assert_finished_times(result)
    assert result._return_value is None
    assert result.errors[0].exception_class is ValueError
    assert 'ValueError(ValueError("This task failed"))' in result.errors[0].traceback
    assert (result.task, result.args, result.kwargs) == (up.raises_complex_exception, [], {})


def test_complex_return_value(finish, caplog):
    # test_complex_return_value: a return value that is not JSON fails the task with TypeError.
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        result = finish(up.returns_a_lambda.enqueue())
    assert any(r.name == LOGGER and r.levelno >= logging.ERROR for r in caplog.records)
    assert result.status == Status.FAILED
    assert_finished_times(result)
    assert result._return_value is None
    assert result.errors[0].exception_class is TypeError
    assert "Unsupported type" in result.errors[0].traceback


def test_result(finish):
    # test_result: backend.enqueue(task, args, kwargs) and the return value.
    result = finish(framework.default_task_backend.enqueue(up.meaning_of_life, [], {}))
    assert (result.status, result.return_value) == (Status.SUCCESSFUL, 42)


def test_result_async(finish):
    # test_result_async: backend.aenqueue.
    result = finish(async_to_sync(framework.default_task_backend.aenqueue)(up.meaning_of_life, [], {}))
    assert (result.status, result.return_value) == (Status.SUCCESSFUL, 42)


def test_get_result_and_refresh_are_supported(finish):
    # test_cannot_get_result / test_cannot_refresh_result: DIFFER BY DESIGN (the immediate backend
    # keeps no results). Ours keeps them: get_result, aget_result, refresh and arefresh all work.
    result = finish(up.meaning_of_life.enqueue())
    backend = framework.default_task_backend
    assert backend.get_result(result.id).return_value == 42
    assert async_to_sync(backend.aget_result)(result.id).return_value == 42
    async_to_sync(result.arefresh)()
    assert result.return_value == 42


def test_run_after_is_supported(scheduler, clock, worker):
    # test_cannot_pass_run_after: DIFFERS BY DESIGN (supports_defer): validate_task accepts run_after.
    later = up.meaning_of_life.using(run_after=clock.now())
    framework.default_task_backend.validate_task(later)
    assert later.enqueue().task.run_after == clock.now()


def test_get_result_from_different_request(finish):
    # test_get_result_from_different_request: DIFFERS BY DESIGN (NotImplementedError there). A result
    # is read back by id alone, as another request or process would (the full cross-process case,
    # with the task's module not imported, is tests/framework/test_fidelity.py).
    result_id = up.meaning_of_life.enqueue().id
    finish(up.meaning_of_life.get_result(result_id))
    fetched = framework.default_task_backend.get_result(result_id)
    assert (fetched.status, fetched.return_value) == (Status.SUCCESSFUL, 42)


def framework_log_lines(finish, caplog, task) -> tuple[object, list[str]]:
    """Enqueue ``task``, run it to the end, and return its result and the framework logger's lines."""
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        result = finish(task.enqueue())
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 3, lines
    return result, lines


def test_enqueue_logs(finish, caplog):
    # test_enqueue_logs: three lines of the framework's logger: enqueued, state=RUNNING, state=SUCCESSFUL.
    result, lines = framework_log_lines(finish, caplog, up.noop)
    assert "enqueued" in lines[0] and result.id in lines[0]
    assert "state=RUNNING" in lines[1] and result.id in lines[1]
    assert "state=SUCCESSFUL" in lines[2] and result.id in lines[2]


def test_failed_logs(finish, caplog):
    # test_failed_logs: the third line says state=FAILED.
    result, lines = framework_log_lines(finish, caplog, up.fails_with_value_error)
    assert "state=RUNNING" in lines[1] and result.id in lines[1]
    assert "state=FAILED" in lines[2] and result.id in lines[2]


def test_successful_task_no_none_type_in_logs(finish, caplog):
    # test_successful_task_no_none_type_in_logs (Django 6.0).
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        result = finish(up.noop.enqueue())
    assert result.status == Status.SUCCESSFUL
    assert "NoneType" not in caplog.text


def test_check():
    # test_check: the configured backend's own check() finds nothing.
    assert list(framework.default_task_backend.check()) == []


def test_takes_context(finish):
    # test_takes_context: the context's task_result is this result.
    result = finish(up.own_id.enqueue())
    assert result.return_value == result.id


def test_context(finish):
    # test_context: context.attempt is the attempt number (1 on the first run).
    assert finish(up.checks_attempt.enqueue(1)).status == Status.SUCCESSFUL


QUEUE_1 = {"default": {"BACKEND": "distsched_app.backends.DistschedBackend", "QUEUES": ["queue-1"]}}


def test_validate_on_enqueue():
    # test_validate_on_enqueue / test_validate_on_aenqueue: a queue the backend does not list.
    task = up.noop.using(queue_name="unknown_queue")
    with override_settings(TASKS=QUEUE_1):
        with pytest.raises(framework.InvalidTask, match="Queue 'unknown_queue' is not valid for backend"):
            task.enqueue()
        with pytest.raises(framework.InvalidTask, match="Queue 'unknown_queue' is not valid for backend"):
            async_to_sync(task.aenqueue)()
    assert not Run.objects.exists()


# -- test_tasks.py (run there against the DummyBackend, which stores results it never runs) ------------


def test_enqueue_task_is_ready():
    # TaskTestCase.test_enqueue_task: READY, the same task, empty arguments.
    result = up.noop.enqueue()
    assert (result.status, result.task, result.args, result.kwargs) == (Status.READY, up.noop, [], {})


def test_enqueue_with_invalid_argument():
    # test_enqueue_with_invalid_argument / test_aenqueue_with_invalid_argument.
    from datetime import datetime

    with pytest.raises(TypeError, match=re.escape("Unsupported type: <class 'datetime.datetime'>")):
        up.noop.enqueue(datetime.now())
    with pytest.raises(TypeError, match=re.escape("Unsupported type: <class 'datetime.datetime'>")):
        async_to_sync(up.noop.aenqueue)(datetime.now())
    assert not Run.objects.exists()


def test_refresh_result():
    # test_refresh_result: refreshing a result nothing has changed leaves every field as it was.
    result = up.noop.enqueue()
    before = dataclasses.asdict(result)
    result.refresh()
    assert dataclasses.asdict(result) == before
    async_to_sync(result.arefresh)()
    assert dataclasses.asdict(result) == before


def test_get_result():
    # test_get_result / test_get_result_async: the result read back equals the enqueued one.
    result = framework.default_task_backend.enqueue(up.noop, (), {})
    assert up.noop.get_result(result.id) == result
    assert async_to_sync(up.noop.aget_result)(result.id) == result


def test_get_missing_result():
    # test_get_missing_result.
    with pytest.raises(framework.TaskResultDoesNotExist):
        up.noop.get_result("123")
    with pytest.raises(framework.TaskResultDoesNotExist):
        async_to_sync(up.noop.aget_result)("123")


def test_get_incorrect_result():
    # test_get_incorrect_result / _async: another task's result is a TaskResultMismatch.
    result = framework.default_task_backend.enqueue(up.noop_async, (), {})
    with pytest.raises(Exception, match="Task does not match") as raised:
        up.noop.get_result(result.id)
    assert type(raised.value).__name__ == "TaskResultMismatch"


def test_invalid_priority():
    # test_invalid_priority: the framework's bounds, whole numbers only.
    message = f"priority must be a whole number between {framework.TASK_MIN_PRIORITY} and {framework.TASK_MAX_PRIORITY}"
    for bad in (-101, 101, 3.1):
        with pytest.raises(framework.InvalidTask, match=message):
            up.noop.using(priority=bad)
    for good in (100, -100, 0):
        assert up.noop.using(priority=good).priority == good


def test_unknown_queue_name():
    # test_unknown_queue_name: validated in using() when the backend lists QUEUES; an empty list accepts any.
    with override_settings(TASKS=QUEUE_1):
        with pytest.raises(framework.InvalidTask, match="Queue 'queue-2' is not valid for backend"):
            up.noop.using(queue_name="queue-2")
    assert up.noop.using(queue_name="queue-2").queue_name == "queue-2"


def test_naive_datetime():
    # test_naive_datetime.
    from datetime import datetime

    with pytest.raises(framework.InvalidTask, match="run_after must be an aware datetime"):
        up.noop.using(run_after=datetime.now())


def test_task_error_invalid_exception(finish):
    # test_task_error_invalid_exception / test_task_error_unknown_module: a stored class path that is
    # not an exception (or not importable) is an error when read, never imported blindly as a class.
    result = finish(up.fails_with_value_error.enqueue())
    error = result.errors[0]
    object.__setattr__(error, "exception_class_path", "subprocess.run")
    with pytest.raises(ValueError, match=re.escape("'subprocess.run' does not reference a valid exception")):
        _ = error.exception_class
    object.__setattr__(error, "exception_class_path", "does.not.exist")
    with pytest.raises(ImportError):
        _ = error.exception_class


def test_call_async_task_sync():
    # test_call_task / test_call_async_task_sync / test_call_async_task: call() never needs a backend.
    assert up.meaning_of_life.call() == 42
    assert up.noop_async.call() is None
    assert asyncio.run(up.meaning_of_life.acall()) == 42


def test_status_transitions_are_seen_by_another_reader(scheduler, clock):
    # The framework's READY -> RUNNING -> SUCCESSFUL/FAILED, read through get_result (as another
    # process would) at each step; Django's suite cannot show RUNNING (its backends run in enqueue).
    result = up.meaning_of_life.enqueue()
    assert framework.default_task_backend.get_result(result.id).status == Status.READY
    worker = scheduler.worker(worker_id="upstream", heartbeat_seconds=3600)
    seen = []
    framework.task_started.connect(
        receiver := lambda sender, task_result, **kw: seen.append(
            framework.default_task_backend.get_result(task_result.id).status
        )
    )
    try:
        assert worker.run_once().state == RunState.SUCCEEDED
    finally:
        framework.task_started.disconnect(receiver)
    assert seen == [Status.RUNNING]
    assert framework.default_task_backend.get_result(result.id).status == Status.SUCCESSFUL
