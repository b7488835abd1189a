"""Per-task options (``services.task_options``): DISTSCHED["TASK_OPTIONS"] over ``@task(...)``,
followed by enqueues and schedules unless they say otherwise; ``retry_on`` / ``give_up_on``
decided in the worker's failure path with the exception the task raised."""

from __future__ import annotations

import pytest

from distsched_app.checks import check_distsched_settings
from distsched_app.models import EventType, Run, RunEvent, RunState
from distsched_app.registry import registry, task
from distsched_app.services import enqueue, schedules

pytestmark = pytest.mark.django_db


class Declined(Exception):
    """A failure no retry can help (tests' own class, imported by its dotted path)."""


@pytest.fixture
def tasks():
    """Tasks declared with options for these tests only."""

    @task("opts.flaky", max_attempts=4, retry_base_seconds=2, retry_max_seconds=20, queue="io", priority=7)
    def flaky(kind: str = "value") -> None:
        raise {"value": ValueError, "key": KeyError, "declined": Declined, "lookup": LookupError}[kind](kind)

    @task("opts.plain")
    def plain() -> None:
        raise ValueError("plain")

    yield
    for name in ("opts.flaky", "opts.plain"):
        registry.unregister(name)


def test_enqueue_follows_the_decorator(tasks, clock):
    run = enqueue.enqueue(enqueue.Job(task_name="opts.flaky"), now=clock.now()).run
    assert (run.queue, run.priority, run.max_attempts) == ("io", 7, 4)
    assert run.retry_policy == {"attempts": 4, "base": 2, "cap": 20, "jitter": 0.0}


def test_settings_win_over_the_decorator_key_by_key(tasks, clock, settings):
    settings.DISTSCHED = {"TASK_OPTIONS": {"opts.flaky": {"queue": "slow", "max_attempts": 9}}}
    run = enqueue.enqueue(enqueue.Job(task_name="opts.flaky"), now=clock.now()).run
    assert (run.queue, run.priority, run.max_attempts) == ("slow", 7, 9)
    assert run.retry_policy["base"] == 2  # the decorator's, where the settings say nothing


def test_an_enqueue_that_says_otherwise_wins(tasks, clock):
    done = enqueue.enqueue_declared(
        task_name="opts.flaky", now=clock.now(), message="m", queue="default", priority=-1, retry={"max_attempts": 1}
    )
    assert (done.run.queue, done.run.priority, done.run.max_attempts) == ("default", -1, 1)


def test_a_task_without_options_keeps_the_defaults(tasks, clock):
    run = enqueue.enqueue(enqueue.Job(task_name="opts.plain"), now=clock.now()).run
    assert (run.queue, run.priority, run.max_attempts) == ("default", 0, 3)


def test_schedules_follow_the_task_unless_they_say_otherwise(tasks, clock, settings):
    settings.DISTSCHED = {"TASK_OPTIONS": {"opts.flaky": {"retry_jitter": 0.5}}}
    s = schedules.create_schedule(name="a", task_name="opts.flaky", interval_seconds=60, now=clock.now())
    assert (s.queue, s.max_attempts, s.retry_base_seconds, s.retry_max_seconds, s.retry_jitter) == (
        "io", 4, 2, 20, 0.5,
    )  # fmt: skip
    s = schedules.create_schedule(
        name="b", task_name="opts.flaky", interval_seconds=60, now=clock.now(), queue="default", max_attempts=2
    )
    assert (s.queue, s.max_attempts, s.retry_base_seconds) == ("default", 2, 2)


def test_a_framework_tasks_schedule_follows_its_queue_and_backend_options(clock):
    mail = schedules.create_schedule(
        name="m", task_name="tests.testapp.tasks.ft_mail", interval_seconds=60, now=clock.now()
    )
    # ft_mail: @task(backend="retrying", queue_name="mail"); "retrying": MAX_ATTEMPTS 3, base 1, max 60.
    assert (mail.queue, mail.max_attempts, mail.retry_base_seconds, mail.retry_max_seconds) == ("mail", 3, 1, 60)
    noop = schedules.create_schedule(
        name="n", task_name="tests.testapp.tasks.ft_noop", interval_seconds=60, now=clock.now()
    )
    assert (noop.queue, noop.max_attempts) == ("default", 1)  # the "default" backend: MAX_ATTEMPTS 1


def test_framework_enqueue_takes_the_options_where_its_declaration_keeps_the_defaults(clock, settings):
    from tests.testapp.tasks import ft_mail, ft_noop

    settings.DISTSCHED = {
        "TASK_OPTIONS": {
            "tests.testapp.tasks.ft_noop": {"queue": "io", "priority": 4, "max_attempts": 6},
            "tests.testapp.tasks.ft_mail": {"queue": "io", "priority": 4},
        }
    }
    result = ft_noop.enqueue()
    run = Run.objects.get(pk=int(result.id))
    assert (run.queue, run.priority, run.max_attempts) == ("io", 4, 6)
    assert (result.task.queue_name, result.task.priority) == ("io", 4)
    mail = Run.objects.get(pk=int(ft_mail.enqueue().id))
    assert (mail.queue, mail.priority) == ("mail", -3)  # its decorator's explicit queue_name and priority stay


def failing_run(scheduler, clock, kind: str):
    run = enqueue.enqueue(enqueue.Job(task_name="opts.flaky", kwargs={"kind": kind}), now=clock.now()).run
    scheduler.worker(worker_id="w", queues=["io"], heartbeat_seconds=3600).run_once()
    run.refresh_from_db()
    return run


def last_event(run):
    return RunEvent.objects.filter(run=run).order_by("-id").values_list("event_type", "message").first()


@pytest.mark.parametrize(
    ("options", "kind", "state", "message"),
    [
        ({}, "value", RunState.RETRYING, None),
        ({"give_up_on": ["tests.services.test_task_options.Declined"]}, "declined", RunState.DEAD,
         "not retried: Declined is in the task's give_up_on (1/4)"),
        ({"give_up_on": ["builtins.LookupError"]}, "key", RunState.DEAD,  # a subclass counts
         "not retried: KeyError is in the task's give_up_on (1/4)"),
        ({"retry_on": ["builtins.KeyError"]}, "value", RunState.DEAD,
         "not retried: ValueError is not in the task's retry_on (1/4)"),
        ({"retry_on": ["builtins.LookupError"]}, "key", RunState.RETRYING, None),
        ({"retry_on": ["builtins.LookupError"], "give_up_on": ["builtins.KeyError"]}, "key", RunState.DEAD,
         "not retried: KeyError is in the task's give_up_on (1/4)"),
        ({"retry_on": []}, "value", RunState.DEAD, "not retried: ValueError is not in the task's retry_on (1/4)"),
    ],
)  # fmt: skip
def test_retry_on_and_give_up_on_with_real_exceptions_through_the_worker(
    tasks, scheduler, clock, settings, options, kind, state, message
):
    settings.DISTSCHED = {"TASK_OPTIONS": {"opts.flaky": options}}
    run = failing_run(scheduler, clock, kind)
    assert run.state == state
    event_type, text = last_event(run)
    if message is None:
        assert event_type == EventType.RETRY_SCHEDULED
    else:
        assert (event_type, text) == (EventType.MARKED_DEAD, message)


def test_give_up_on_from_the_decorator_as_a_class(scheduler, clock):
    @task("opts.declines", give_up_on=[Declined], queue="io")
    def declines() -> None:
        raise Declined("card declined")

    try:
        enqueue.enqueue(enqueue.Job(task_name="opts.declines"), now=clock.now())
        scheduler.worker(worker_id="w", queues=["io"], heartbeat_seconds=3600).run_once()
        run = Run.objects.get()
        assert run.state == RunState.DEAD and run.attempts == 1
    finally:
        registry.unregister("opts.declines")


def errors(settings, options):
    settings.DISTSCHED = {"TASK_OPTIONS": options}
    return [m.msg for m in check_distsched_settings(None) if m.id == "distsched.E021"]


def test_the_check_names_the_task_and_what_is_wrong(settings):
    assert errors(settings, {"opts.x": {"max_attempts": 5, "retry_on": ["builtins.KeyError"]}}) == []
    assert errors(settings, {"opts.x": {"retries": 5}}) == [
        "DISTSCHED['TASK_OPTIONS'] 'opts.x' has unknown option(s) retries (known: max_attempts, retry_base_seconds, "
        "retry_max_seconds, retry_jitter, retry_on, give_up_on, queue, priority, timeout)."
    ]
    assert errors(settings, {"opts.x": {"max_attempts": 0}}) == [
        "DISTSCHED['TASK_OPTIONS'] 'opts.x': max_attempts must be between 1 and 1000."
    ]
    assert errors(settings, {"opts.x": {"retry_on": ["nowhere.Boom"]}})[0].startswith(
        "DISTSCHED['TASK_OPTIONS'] 'opts.x': retry_on: cannot import 'nowhere.Boom' ("
    )
    assert errors(settings, {"opts.x": {"give_up_on": ["builtins.len"]}}) == [
        "DISTSCHED['TASK_OPTIONS'] 'opts.x': give_up_on: 'builtins.len' is not an exception class."
    ]
    assert errors(settings, {"opts.x": {"retry_on": "builtins.KeyError"}}) == [
        "DISTSCHED['TASK_OPTIONS'] 'opts.x': retry_on must be a list of exception classes (dotted paths), "
        "not 'builtins.KeyError'."
    ]
    assert errors(settings, {"opts.x": {"queue": "no spaces"}})[0].startswith(
        "DISTSCHED['TASK_OPTIONS'] 'opts.x': queue "
    )


def test_the_decorator_refuses_unknown_options():
    with pytest.raises(TypeError, match=r"^unknown @task option\(s\): retries \(known: max_attempts, "):
        task("opts.bad", retries=3)


def test_the_check_reads_the_decorators_options_too(settings):
    @task("opts.bad_value", max_attempts=0)
    def bad() -> None:
        return None

    try:
        assert errors(settings, {}) == [
            "DISTSCHED['TASK_OPTIONS'] (@task) 'opts.bad_value': max_attempts must be between 1 and 1000."
        ]
    finally:
        registry.unregister("opts.bad_value")


def test_the_check_refuses_a_queue_the_framework_tasks_backend_does_not_accept(settings, monkeypatch):
    from distsched_app.services import validation

    monkeypatch.setattr(validation, "backend_queues", lambda name: frozenset({"default", "mail"}))
    assert errors(settings, {"tests.testapp.tasks.ft_noop": {"queue": "mail"}}) == []
    assert errors(settings, {"tests.testapp.tasks.ft_noop": {"queue": "io"}}) == [
        "DISTSCHED['TASK_OPTIONS'] 'tests.testapp.tasks.ft_noop': queue 'io' is not one of its backend's QUEUES "
        "(default, mail)."
    ]
