"""Django's task framework, the same tests against its reference ``ImmediateBackend`` and ours.

Where the framework defines the behaviour (results, statuses, errors, context,
signals, validation), distsched's backend must behave as the reference does;
the only difference is *when* a task runs: the immediate backend runs it inside
``enqueue``, distsched when a worker claims it. ``finish`` hides that: for
distsched it runs a worker pass and refreshes the result. Runs on both
databases and, in CI, on Django 5.2 (the backport) and Django 6.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

import pytest

from distsched_app import framework
from tests.testapp import tasks as t

pytestmark = pytest.mark.django_db

BACKENDS = ["immediate", "default"]  # tests/settings.py: the reference, and DistschedBackend


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture
def finish(scheduler, backend):
    """Run what was enqueued to its end, as each backend does it."""

    def run(result):
        if backend == "default":
            worker = scheduler.worker(worker_id="conformance", heartbeat_seconds=3600)
            while worker.run_once() is not None:
                pass
            result.refresh()
        return result

    return run


@pytest.fixture
def signals():
    seen: list[tuple[str, type, str, object]] = []

    def receiver(name):
        def receive(sender, task_result, **kwargs):
            seen.append((name, sender, task_result.id, task_result.status))

        return receive

    receivers = {name: receiver(name) for name in ("enqueued", "started", "finished")}
    framework.task_enqueued.connect(receivers["enqueued"])
    framework.task_started.connect(receivers["started"])
    framework.task_finished.connect(receivers["finished"])
    yield seen
    framework.task_enqueued.disconnect(receivers["enqueued"])
    framework.task_started.disconnect(receivers["started"])
    framework.task_finished.disconnect(receivers["finished"])


def test_enqueue_returns_a_result_for_this_task_and_backend(backend):
    task = t.ft_add.using(backend=backend)
    result = task.enqueue(2, 3)
    assert isinstance(result, framework.TaskResult)
    assert result.task == task and result.backend == backend
    assert isinstance(result.id, str) and 0 < len(result.id) < 64
    assert result.args == [2, 3] and result.kwargs == {}
    assert result.enqueued_at is not None


def test_arguments_are_normalised_to_json(backend, finish):
    result = finish(t.ft_add.using(backend=backend).enqueue(*(1, 2)))
    assert result.args == [1, 2]  # a tuple becomes a list


def test_a_non_json_argument_is_a_type_error(backend):
    with pytest.raises(TypeError, match="Unsupported type"):
        t.ft_add.using(backend=backend).enqueue(datetime(2026, 1, 1), 1)


def test_undecodable_bytes_are_a_value_error(backend):
    with pytest.raises(ValueError, match="Unsupported value"):
        t.ft_add.using(backend=backend).enqueue(b"\xff", 1)


def test_success(backend, finish):
    result = finish(t.ft_add.using(backend=backend).enqueue(20, 22))
    assert result.status == framework.TaskResultStatus.SUCCESSFUL
    assert result.is_finished and result.return_value == 42
    assert result.errors == [] and result.attempts == 1 and len(result.worker_ids) == 1
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at is not None


def test_failure(backend, finish):
    result = finish(t.ft_fail.using(backend=backend).enqueue("it broke"))
    assert result.status == framework.TaskResultStatus.FAILED
    assert result.is_finished and result.finished_at is not None
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value
    assert result.errors, "one TaskError per failed attempt"
    error = result.errors[-1]
    assert error.exception_class is ValueError
    assert error.exception_class_path == "builtins.ValueError"
    assert error.traceback.endswith("ValueError: it broke\n")


def test_takes_context(backend, finish):
    result = finish(t.ft_context.using(backend=backend).enqueue(note="hello"))
    assert result.status == framework.TaskResultStatus.SUCCESSFUL
    seen = result.return_value
    assert seen["id"] == result.id and seen["attempt"] == 1 and seen["note"] == "hello"
    assert seen["worker_ids"] == result.worker_ids


def test_async_task(backend, finish):
    result = finish(t.ft_async.using(backend=backend).enqueue(21))
    assert result.status == framework.TaskResultStatus.SUCCESSFUL and result.return_value == 42


def test_signals_in_order_with_the_backend_class_as_sender(backend, finish, signals):
    result = finish(t.ft_add.using(backend=backend).enqueue(1, 2))
    kinds = [(name, status) for name, _, rid, status in signals if rid == result.id]
    assert kinds == [("enqueued", "READY"), ("started", "RUNNING"), ("finished", "SUCCESSFUL")]
    expected = type(t.ft_add.using(backend=backend).get_backend())
    assert {sender for _, sender, rid, _ in signals if rid == result.id} == {expected}


def test_finished_signal_of_a_failure(backend, finish, signals):
    result = finish(t.ft_fail.using(backend=backend).enqueue())
    assert [(n, s) for n, _, rid, s in signals if rid == result.id][-1] == ("finished", "FAILED")


@pytest.mark.parametrize("priority", [-101, 101, 1.5])
def test_priority_out_of_range_is_invalid(backend, priority):
    with pytest.raises(framework.InvalidTask, match="priority"):
        t.ft_add.using(backend=backend, priority=priority)


@pytest.mark.parametrize("priority", [-100, 0, 100])
def test_priority_at_its_bounds_is_valid(backend, priority, finish):
    result = finish(t.ft_add.using(backend=backend, priority=priority).enqueue(1, 1))
    assert result.status == framework.TaskResultStatus.SUCCESSFUL


def test_takes_context_needs_a_context_parameter(backend):
    with pytest.raises(framework.InvalidTask, match="context"):
        dataclasses.replace(t.ft_add.using(backend=backend), takes_context=True)


def test_a_naive_run_after_is_invalid_where_run_after_is_supported():
    with pytest.raises(framework.InvalidTask, match="aware"):
        t.ft_add.using(run_after=datetime(2030, 1, 1))


def test_run_after_defers_execution(scheduler, clock):
    result = t.ft_add.using(run_after=clock.now() + timedelta(minutes=5)).enqueue(1, 2)
    worker = scheduler.worker(worker_id="w", heartbeat_seconds=3600)
    assert worker.run_once() is None  # not yet
    clock.advance(minutes=5)
    assert worker.run_once() is not None
    result.refresh()
    assert result.status == framework.TaskResultStatus.SUCCESSFUL


# -- defined only where a backend keeps results and runs later (not the immediate backend) -------------


def test_a_result_not_finished_has_no_return_value():
    result = t.ft_add.enqueue(1, 1)
    assert result.status == framework.TaskResultStatus.READY and not result.is_finished
    assert result.started_at is None and result.finished_at is None and result.attempts == 0
    with pytest.raises(ValueError, match="not finished"):
        _ = result.return_value


def test_get_result_of_an_unknown_id():
    backend_obj = t.ft_add.get_backend()
    assert backend_obj.supports_get_result
    for unknown in ("999999999", "abc", "", "1" * 30):
        with pytest.raises(framework.TaskResultDoesNotExist):
            backend_obj.get_result(unknown)


@pytest.mark.parametrize("backend", ["default"])
def test_get_result_round_trip(backend, finish):
    task = t.ft_add.using(backend=backend)
    result = finish(task.enqueue(4, 5))
    fetched = task.get_result(result.id)
    assert (fetched.id, fetched.status, fetched.return_value, fetched.args) == (result.id, result.status, 9, [4, 5])
    assert fetched.worker_ids == result.worker_ids and fetched.finished_at == result.finished_at


@pytest.mark.parametrize("backend", ["default"])
def test_get_result_of_another_task_is_a_mismatch(backend, finish):
    task = t.ft_add.using(backend=backend)
    result = finish(task.enqueue(1, 2))
    with pytest.raises(Exception, match="Task does not match"):
        t.ft_noop.using(backend=backend).get_result(result.id)
