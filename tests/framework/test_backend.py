"""What distsched's backend adds to the framework: enqueued runs are runs.

Retries with backoff and one error per attempt, dead runs, priorities before
time, deferred runs, the caller's transaction, unique enqueue, cancel and
requeue, prune, schedules of framework tasks, only registered functions, the
statement budget of one enqueue, the bulk path and the backend's settings.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from distsched_app import framework
from distsched_app.backends import DistschedBackend, enqueue_unique
from distsched_app.errors import InvalidPayload, ValidationError
from distsched_app.models import EventType, Origin, Run, RunEvent, RunState
from distsched_app.services import enqueue as enqueue_service
from distsched_app.services import maintenance, runs
from tests.testapp import tasks as t

pytestmark = pytest.mark.django_db

Status = framework.TaskResultStatus


@pytest.fixture
def worker(scheduler):
    return scheduler.worker(worker_id="w1", heartbeat_seconds=3600)


def drain(worker) -> int:
    n = 0
    while worker.run_once() is not None:
        n += 1
    return n


def events_of(result) -> list[str]:
    return list(RunEvent.objects.filter(run_id=int(result.id)).order_by("id").values_list("event_type", flat=True))


def test_an_enqueued_run_is_a_run_without_a_schedule(clock):
    result = t.ft_add.enqueue(1, 2)
    run = Run.objects.get(pk=int(result.id))
    assert (run.schedule_id, run.origin, run.state, run.task_name) == (
        None,
        Origin.ENQUEUED,
        RunState.PENDING,
        "tests.testapp.tasks.ft_add",
    )
    assert run.idempotency_key == f"enqueued:{run.pk}" and run.args == [1, 2] and run.priority == 0
    assert run.scheduled_for == run.available_at == run.created_at == clock.now()
    assert run.retry_policy == {"attempts": 1, "base": 10.0, "cap": 3600.0, "jitter": 0.0}  # TASKS OPTIONS
    assert events_of(result) == ["created"]


def test_failed_attempts_retry_with_backoff_and_each_leaves_an_error(worker, clock):
    result = t.ft_flaky.using(backend="retrying").enqueue(fail_attempts=2)
    assert worker.run_once().state == RunState.RETRYING
    run = Run.objects.get(pk=int(result.id))
    assert run.available_at == clock.now() + timedelta(seconds=1)  # RETRY_BASE_SECONDS=1, first retry
    assert worker.run_once() is None  # backing off
    clock.advance(seconds=1)
    assert worker.run_once().state == RunState.RETRYING
    clock.advance(seconds=2)  # doubled
    assert worker.run_once().state == RunState.SUCCEEDED
    result.refresh()
    assert result.status == Status.SUCCESSFUL and result.return_value == 3
    assert result.attempts == 3 and result.worker_ids == ["w1", "w1", "w1"]
    assert [e.exception_class for e in result.errors] == [RuntimeError, RuntimeError]
    assert "planned failure on attempt 1" in result.errors[0].traceback
    assert "planned failure on attempt 2" in result.errors[1].traceback
    assert result.started_at < result.last_attempted_at <= result.finished_at


def test_out_of_attempts_the_run_is_dead_and_the_result_failed(worker, clock):
    result = t.ft_fail.using(backend="retrying").enqueue("always")
    for _ in range(3):
        worker.run_once()
        clock.advance(seconds=60)
    result.refresh()
    assert result.status == Status.FAILED and len(result.errors) == 3
    assert Run.objects.get(pk=int(result.id)).state == RunState.DEAD
    assert events_of(result)[-1] == EventType.MARKED_DEAD


def test_higher_priority_runs_are_claimed_first_then_the_oldest(worker, clock, make_schedule, scheduler):
    low = t.ft_add.using(priority=-5).enqueue(1, 1)
    make_schedule("scheduled")  # priority 0, due now
    scheduler.tick()
    clock.advance(seconds=1)
    high = t.ft_add.using(priority=50).enqueue(2, 2)
    later_high = t.ft_add.using(priority=50).enqueue(3, 3)
    order = [worker.run_once().run_id for _ in range(4)]
    scheduled = Run.objects.get(schedule__name="scheduled").pk
    assert order == [int(high.id), int(later_high.id), scheduled, int(low.id)]


def test_the_decorators_priority_and_queue_are_the_runs(worker):
    result = t.ft_urgent.enqueue()
    run = Run.objects.get(pk=int(result.id))
    assert (run.priority, run.queue) == (5, "urgent")
    assert worker.run_once() is None  # w1 serves "default" only
    urgent = worker.__class__(worker_id="w2", queues=["urgent"], heartbeat_seconds=3600, clock=worker.clock)
    assert urgent.run_once().state == RunState.SUCCEEDED


@pytest.mark.django_db(transaction=True)
def test_a_rollback_leaves_no_run_and_no_event():
    with pytest.raises(RuntimeError), transaction.atomic():
        t.ft_add.enqueue(1, 2)
        assert Run.objects.count() == 1  # written in the caller's transaction
        raise RuntimeError("the request failed")
    assert not Run.objects.exists() and not RunEvent.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_nothing_is_visible_to_workers_before_the_commit():
    import threading

    seen = []

    def other_connection():
        from django.db import connections

        seen.append(Run.objects.count())
        connections.close_all()

    with transaction.atomic():
        result = t.ft_add.enqueue(1, 2)
        thread = threading.Thread(target=other_connection)
        thread.start()
        thread.join()
    assert seen == [0]
    assert Run.objects.filter(pk=int(result.id)).exists()


def test_one_enqueue_is_one_statement_on_either_database():
    t.ft_add.enqueue(0, 0)  # warm up (the backend, the task's registration)
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        t.ft_add.enqueue(1, 2)
    statements = [q["sql"].lstrip().split()[0].upper() for q in queries.captured_queries]
    if connection.vendor == "postgresql":
        assert statements == ["SELECT"]  # one call of the function that writes the run and its event
    else:
        assert statements == ["INSERT"]  # into the view whose trigger writes the run and its event


def test_trigger_costs_what_an_enqueue_costs_and_its_audit_entry(make_schedule, scheduler):
    make_schedule("manual")
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        run = scheduler.trigger("manual")
    statements = [q["sql"].lstrip().split()[0].upper() for q in queries.captured_queries]
    run_and_event = ["WITH"] if connection.vendor == "postgresql" else ["INSERT", "INSERT"]
    assert statements == [*run_and_event, "INSERT"]  # the audit entry, in the same transaction
    stored = Run.objects.get(pk=run.pk)
    assert (stored.origin, stored.idempotency_key, stored.schedule.name) == (
        Origin.MANUAL,
        f"manual:{run.pk}",
        "manual",
    )
    assert list(stored.events.values_list("event_type", flat=True)) == ["created"]


def test_the_bulk_path_writes_every_run_and_event_with_ids_in_order(clock):
    jobs = [enqueue_service.Job(task_name="tests.testapp.tasks.ft_add", args=[i, i]) for i in range(1200)]
    written = enqueue_service.enqueue_many(jobs, now=clock.now())
    ids = [r.pk for r in written]
    assert ids == sorted(ids) and len(set(ids)) == 1200
    assert [r.args for r in Run.objects.filter(pk__in=ids).order_by("id")] == [[i, i] for i in range(1200)]
    assert RunEvent.objects.filter(run_id__in=ids, event_type=EventType.CREATED).count() == 1200
    assert all(r.idempotency_key == f"enqueued:{r.pk}" for r in Run.objects.filter(pk__in=ids))


def test_unique_enqueue_returns_the_active_run_until_it_is_finished(worker, signals_seen):
    first = enqueue_unique(t.ft_add, "welcome:42", 1, 2)
    again = enqueue_unique(t.ft_add, "welcome:42", 1, 2)
    assert again.id == first.id and Run.objects.count() == 1
    assert [s for s in signals_seen if s == ("enqueued", first.id)] == [("enqueued", first.id)]
    worker.run_once()
    after = enqueue_unique(t.ft_add, "welcome:42", 1, 2)
    assert after.id != first.id and Run.objects.filter(unique_key="welcome:42").count() == 2


def test_a_unique_key_held_by_another_task_enqueues_this_one(clock):
    add = enqueue_unique(t.ft_add, "welcome:42", 1, 2)
    noop = enqueue_unique(t.ft_noop, "welcome:42")
    assert noop.id != add.id and Run.objects.count() == 2
    assert (noop.task.func, noop.args, noop.kwargs) == (t.ft_noop.func, [], {})
    assert Run.objects.get(pk=int(noop.id)).task_name == "tests.testapp.tasks.ft_noop"
    again = enqueue_unique(t.ft_noop, "welcome:42")
    assert (again.id, again.task.func, again.args) == (noop.id, t.ft_noop.func, [])
    assert t.ft_noop.get_result(noop.id).task.func is t.ft_noop.func
    # The result of the run holding the key describes that run, not the caller's variant of the task.
    urgent = enqueue_unique(t.ft_add.using(priority=5), "urgent:1", 1, 2)
    held = enqueue_unique(t.ft_add, "urgent:1", 3, 4)
    assert (held.id, held.task.priority, held.args) == (urgent.id, 5, [1, 2])


@pytest.mark.parametrize("key", ["", "   "])
def test_enqueue_unique_refuses_a_blank_key(clock, key):
    with pytest.raises(ValidationError) as info:
        enqueue_unique(t.ft_add, key, 1, 2)
    assert info.value.field == "unique_key" and "unique_key" in str(info.value)
    assert not Run.objects.exists()


@pytest.fixture
def signals_seen():
    seen: list[tuple[str, str]] = []

    def on_enqueued(sender, task_result, **kwargs):
        seen.append(("enqueued", task_result.id))

    framework.task_enqueued.connect(on_enqueued)
    yield seen
    framework.task_enqueued.disconnect(on_enqueued)


def test_cancel_and_requeue_an_enqueued_run(worker, clock):
    result = t.ft_add.enqueue(1, 2)
    runs.cancel_run(int(result.id), now=clock.now())
    result.refresh()
    assert result.status == Status.FAILED
    requeued = runs.requeue_run(int(result.id), now=clock.now())
    assert requeued.max_attempts == 1  # attempts 0 + its own budget of 1
    result.refresh()
    assert result.status == Status.READY
    assert worker.run_once().state == RunState.SUCCEEDED


def test_prune_removes_finished_enqueued_runs(worker, clock):
    result = t.ft_add.enqueue(1, 2)
    worker.run_once()
    clock.advance(days=2)
    pruned = maintenance.prune_runs(older_than=timedelta(days=1), now=clock.now())
    assert pruned.runs == 1 and not Run.objects.filter(pk=int(result.id)).exists()


def test_a_schedule_can_run_a_framework_task_with_its_context(scheduler, worker):
    scheduler.create_schedule(
        name="fw", task_name="tests.testapp.tasks.ft_context", interval_seconds=60, kwargs={"note": "from a schedule"}
    )
    [run] = scheduler.tick()
    assert worker.run_once().state == RunState.SUCCEEDED
    run.refresh_from_db()
    assert run.result["note"] == "from a schedule" and run.result["attempt"] == 1
    assert run.result["idempotency_key"] == run.idempotency_key and run.result["fencing_token"] == f"{run.pk}:1"
    result = t.ft_context.get_result(str(run.pk))
    assert result.status == Status.SUCCESSFUL and result.return_value["note"] == "from a schedule"


def test_a_stored_path_that_is_not_a_registered_task_is_given_back_without_importing(worker, clock, monkeypatch):
    import importlib

    imported = []
    real = importlib.import_module
    monkeypatch.setattr(importlib, "import_module", lambda name, *a, **k: imported.append(name) or real(name, *a, **k))
    result = t.ft_add.enqueue(1, 2)
    Run.objects.filter(pk=int(result.id)).update(task_name="os.system")
    assert worker.run_once().state == RunState.PENDING  # given back, its attempt unused (MAX_ATTEMPTS=1)
    run = Run.objects.get(pk=int(result.id))
    assert (run.state, run.attempts, run.last_error) == (RunState.PENDING, 0, "")
    assert imported == []


def test_get_result_of_a_run_of_a_distsched_task_does_not_exist(make_schedule, scheduler):
    make_schedule("plain", task_name="tests.noop")
    [run] = scheduler.tick()
    with pytest.raises(framework.TaskResultDoesNotExist):
        t.ft_add.get_backend().get_result(str(run.pk))


@pytest.mark.django_db(transaction=True)
def test_async_task_honours_cooperative_cancel(worker, clock):
    import threading

    result = t.ft_async_cancellable.enqueue()
    run_id = int(result.id)

    def cancel_soon():
        import time

        from django.db import connections

        time.sleep(0.1)
        runs.cancel_run(run_id, now=clock.now())
        connections.close_all()

    thread = threading.Thread(target=cancel_soon)
    thread.start()
    execution = worker.run_once()
    thread.join()
    assert execution.state == RunState.CANCELLED


def test_extras_of_the_context(worker):
    result = t.ft_context.enqueue()
    worker.run_once()
    result.refresh()
    seen = result.return_value
    assert seen["idempotency_key"] == f"enqueued:{result.id}" and seen["fencing_token"] == f"{result.id}:1"


def test_unstorable_arguments_are_refused_and_nothing_is_written():
    with pytest.raises(InvalidPayload):
        t.ft_add.enqueue("nul\x00", 1)
    assert not Run.objects.exists()


def nested(levels: int) -> list:
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


def cycle() -> list:
    value: list = []
    value.append(value)
    return value


# Every payload Task.enqueue refuses, through the framework's own check (normalize_json) or ours.
BAD_PAYLOADS = {
    "a set": (({1, 2}, 1), {}),
    "an object": ((object(), 1), {}),
    "undecodable bytes": ((b"\xff", 1), {}),
    "a tuple key": (({(1, 2): 3}, 1), {}),
    "NaN": ((float("nan"), 1), {}),
    "infinity": ((1, float("-inf")), {}),
    "5000 levels in args": ((nested(5000), 1), {}),
    "5000 levels in kwargs": ((), {"a": nested(5000), "b": 1}),
    "a cycle": ((cycle(), 1), {}),
    "33 levels": ((nested(33), 1), {}),
    "too large": (("x" * 70_000, 1), {}),
    "a 5000-digit integer": ((10**5000, 1), {}),
    "NUL": (("nul\x00", 1), {}),
    "a lone surrogate": ((1,), {"b": "\udcff"}),
}


@pytest.mark.parametrize(("args", "kwargs"), BAD_PAYLOADS.values(), ids=BAD_PAYLOADS.keys())
def test_every_payload_enqueue_refuses_is_one_invalid_payload_error_and_nothing_is_written(args, kwargs):
    with pytest.raises(InvalidPayload) as refused:
        t.ft_add.enqueue(*args, **kwargs)
    assert isinstance(refused.value, TypeError) and isinstance(refused.value, ValueError)  # what the framework raises
    assert refused.value.field in ("args", "kwargs") and "\n" not in str(refused.value)
    assert not Run.objects.exists() and not RunEvent.objects.exists()


def test_bytes_in_utf8_are_text_as_the_framework_normalises_them():
    result = t.ft_add.enqueue(b"caf\xc3\xa9", b"!")
    assert result.args == ["café", "!"] and Run.objects.get(pk=int(result.id)).args == ["café", "!"]


@pytest.fixture
def default_queue_only(settings):
    """The default backend accepts the "default" queue only (tests/settings.py: any)."""
    settings.TASKS = {**settings.TASKS, "default": {**settings.TASKS["default"], "QUEUES": ["default"]}}


def test_a_schedule_of_a_framework_task_on_a_queue_its_backend_refuses_is_a_queue_error(scheduler, default_queue_only):
    with pytest.raises(ValidationError) as refused:
        scheduler.create_schedule(
            name="fw", task_name="tests.testapp.tasks.ft_noop", interval_seconds=60, queue="other"
        )
    assert refused.value.field == "queue" and "QUEUES (default)" in str(refused.value)
    schedule = scheduler.create_schedule(name="fw", task_name="tests.testapp.tasks.ft_noop", interval_seconds=60)
    with pytest.raises(ValidationError) as refused:
        scheduler.update_schedule("fw", queue="other")
    assert refused.value.field == "queue"
    schedule.refresh_from_db()
    assert schedule.queue == "default"
    plain = scheduler.create_schedule(name="plain", task_name="tests.noop", interval_seconds=60, queue="other")
    assert plain.queue == "other"  # a distsched task has no backend: any queue


def test_a_run_on_a_queue_its_backend_no_longer_accepts_runs_and_has_a_result(scheduler, settings):
    scheduler.create_schedule(name="fw", task_name="tests.testapp.tasks.ft_context", interval_seconds=60, queue="other")
    [run] = scheduler.tick()  # written while QUEUES accepted any queue; then "other" leaves QUEUES
    settings.TASKS = {**settings.TASKS, "default": {**settings.TASKS["default"], "QUEUES": ["default"]}}
    pending = t.ft_context.get_result(str(run.pk))
    assert pending.status == Status.READY and pending.task.queue_name == "default"  # seen on its declared queue
    worker = scheduler.worker(worker_id="w1", queues=["other"], heartbeat_seconds=3600)
    assert worker.run_once().state == RunState.SUCCEEDED
    done = t.ft_context.get_result(str(run.pk))
    assert done.status == Status.SUCCESSFUL and done.return_value["attempt"] == 1
    Run.objects.filter(pk=run.pk).update(state=RunState.DEAD)  # as such runs ended before: failed
    assert t.ft_context.get_result(str(run.pk)).status == Status.FAILED


def test_a_queue_distsched_cannot_name_is_invalid():
    with pytest.raises(framework.InvalidTask, match="not a valid distsched queue"):
        t.ft_add.using(queue_name="bad queue!")


@pytest.mark.parametrize(
    ("options", "message"),
    [({"MAX_ATTEMPTS": 0}, "max_attempts"), ({"RETRY_JITTER": 5}, "retry_jitter"), ({"NOPE": 1}, "unknown OPTIONS")],
)
def test_bad_options_are_a_system_check_error_and_refuse_to_enqueue(options, message):
    backend = DistschedBackend("bad", {"QUEUES": [], "OPTIONS": options})
    [problem] = backend.check()
    assert problem.id == "distsched.E010" and message in problem.msg
    with pytest.raises(framework.InvalidTask, match="misconfigured"):
        backend.enqueue(t.ft_add, (1, 2), {})


def test_the_async_api_enqueues_and_reads_results_like_the_sync_one(worker):
    from asgiref.sync import async_to_sync

    from distsched_app.backends import aenqueue_unique

    async def enqueue_and_read():
        result = await t.ft_add.aenqueue(20, 22)
        same = await aenqueue_unique(t.ft_add, "async:1", 1, 1)
        again = await aenqueue_unique(t.ft_add, "async:1", 1, 1)
        pending = await t.ft_add.aget_result(result.id)
        return result, same, again, pending

    result, same, again, pending = async_to_sync(enqueue_and_read)()
    assert again.id == same.id and Run.objects.count() == 2
    assert pending.status == Status.READY
    drain(worker)
    finished = async_to_sync(t.ft_add.aget_result)(result.id)
    assert (finished.status, finished.return_value) == (Status.SUCCESSFUL, 42)


def test_a_signal_receiver_that_raises_does_not_change_the_outcome(worker):
    def broken(sender, **kwargs):
        raise RuntimeError("receiver bug")

    framework.task_started.connect(broken)
    framework.task_finished.connect(broken)
    try:
        result = t.ft_add.enqueue(1, 2)
        drain(worker)
    finally:
        framework.task_started.disconnect(broken)
        framework.task_finished.disconnect(broken)
    result.refresh()
    assert (result.status, result.return_value) == (Status.SUCCESSFUL, 3)
    assert Run.objects.get(pk=int(result.id)).state == RunState.SUCCEEDED
