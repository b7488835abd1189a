"""What the surfaces need from ``services.enqueue``: who enqueued (the event's message), and an
enqueued run's own retry policy under the names callers give it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction

from distsched_app.backoff import RetryPolicy
from distsched_app.errors import ValidationError
from distsched_app.models import EventType, Run, RunEvent
from distsched_app.services import enqueue
from distsched_app.services.events import MAX_MESSAGE_CHARS

pytestmark = pytest.mark.django_db


def test_the_created_event_says_who_enqueued(clock):
    done = enqueue.enqueue(enqueue.Job(task_name="tests.noop"), now=clock.now(), message="enqueued by ann via the API")
    [event] = RunEvent.objects.all()
    assert (event.run_id, event.event_type, event.message) == (
        done.run.pk,
        EventType.CREATED,
        "enqueued by ann via the API",
    )


@pytest.mark.parametrize("key", ["", "k"])
def test_the_stored_run_is_the_run_the_service_returns_column_for_column(clock, key):
    """PostgreSQL's enqueue function (migration 0025) and SQLite's INSERTs name their columns
    themselves: every column they write, or leave to its default, is what the model says."""
    job = enqueue.Job(
        task_name="tests.noop", args=[1, "two"], kwargs={"k": [3]}, queue="fast", priority=7,
        run_after=clock.now() + timedelta(minutes=5), unique_key=key, backend="default",
    )  # fmt: skip
    policy = RetryPolicy(max_attempts=4, base=2.0, cap=30.0, jitter=0.5)
    returned = enqueue.enqueue(job, now=clock.now(), policy=policy).run
    stored = Run.objects.get()
    columns = [f.attname for f in Run._meta.concrete_fields]
    assert {c: getattr(stored, c) for c in columns} == {c: getattr(returned, c) for c in columns}
    assert (stored.idempotency_key, stored.unique_key, stored.priority) == (f"enqueued:{stored.pk}", key, 7)


def test_the_default_message_is_unchanged(clock):
    enqueue.enqueue(enqueue.Job(task_name="tests.noop"), now=clock.now())
    assert RunEvent.objects.get().message == enqueue.ENQUEUED_MESSAGE == "enqueued"


def test_the_message_is_made_storable_and_bounded(clock):
    enqueue.enqueue(enqueue.Job(task_name="tests.noop"), now=clock.now(), message="by \x00 " + "x" * 5000)
    message = RunEvent.objects.get().message
    assert "\x00" not in message and message.startswith("by \\x00 ") and len(message) <= MAX_MESSAGE_CHARS


def test_a_unique_key_held_writes_no_second_event_whatever_the_message(clock):
    job = enqueue.Job(task_name="tests.noop", unique_key="k")
    first = enqueue.enqueue(job, now=clock.now(), message="first")
    again = enqueue.enqueue(job, now=clock.now(), message="second")
    assert (again.created, again.run.pk) == (False, first.run.pk)
    assert list(RunEvent.objects.values_list("message", flat=True)) == ["first"]


def test_a_unique_key_is_held_per_task(clock):
    noop = enqueue.enqueue(enqueue.Job(task_name="tests.noop", unique_key="k"), now=clock.now())
    echo = enqueue.enqueue(enqueue.Job(task_name="tests.echo", args=[1], unique_key="k"), now=clock.now())
    assert (noop.created, echo.created) == (True, True) and noop.pk != echo.pk
    again = enqueue.enqueue(enqueue.Job(task_name="tests.echo", args=[2], unique_key="k"), now=clock.now())
    assert (again.created, again.pk, again.run.task_name, again.args) == (False, echo.pk, "tests.echo", [1])
    assert Run.objects.count() == 2 and RunEvent.objects.count() == 2


@pytest.mark.parametrize("key", [" ", "\t\n "])
def test_a_blank_unique_key_is_refused(clock, key):
    with pytest.raises(ValidationError) as info:
        enqueue.enqueue(enqueue.Job(task_name="tests.noop", unique_key=key), now=clock.now())
    assert info.value.field == "unique_key"
    assert not Run.objects.exists()


def test_policy_fields_are_what_validate_policy_takes():
    fields = {"max_attempts": 5, "retry_base_seconds": 2.5, "retry_max_seconds": 60.0, "retry_jitter": 0.25}
    policy = enqueue.validate_policy(fields)
    assert enqueue.policy_fields(policy) == fields
    assert tuple(fields) == enqueue.POLICY_FIELDS
    assert enqueue.validate_policy({}) == enqueue.default_policy()  # nothing given: the settings


def test_own_policy_of_an_enqueued_run_and_of_a_scheduled_one(clock, scheduler, make_schedule):
    policy = RetryPolicy(max_attempts=4, base=3.0, cap=30.0, jitter=0.5)
    run = enqueue.enqueue(enqueue.Job(task_name="tests.noop"), now=clock.now(), policy=policy).run
    assert enqueue.own_policy(run) == policy
    assert enqueue.own_policy(Run.objects.get(pk=run.pk)) == policy  # read back from the row
    make_schedule("s1")
    [scheduled] = scheduler.tick()
    assert enqueue.own_policy(scheduled) is None  # it follows its schedule's


@pytest.mark.parametrize("stored", [{"attempts": 3}, {"base": 1, "cap": 2}, ["not", "an", "object"], {"attempts": "x"}])
def test_own_policy_of_a_policy_written_by_hand_is_none_not_an_error(clock, stored):
    run = enqueue.enqueue(enqueue.Job(task_name="tests.noop"), now=clock.now()).run
    Run.objects.filter(pk=run.pk).update(retry_policy=stored)
    assert enqueue.own_policy(Run.objects.get(pk=run.pk)) is None


# ------------------------------------------------------------ an operator's enqueue: the declaration's defaults


def test_a_framework_task_enqueued_by_hand_follows_its_declaration(clock):
    done = enqueue.enqueue_declared(task_name="tests.testapp.tasks.ft_mail", now=clock.now(), message="by hand")
    run = Run.objects.get(pk=done.pk)
    assert (run.queue, run.priority) == ("mail", -3)  # @task(queue_name="mail", priority=-3)
    assert RetryPolicy.from_json(run.retry_policy) == RetryPolicy(max_attempts=3, base=1, cap=60)  # its OPTIONS


def test_what_the_request_gives_overrides_the_declaration_field_by_field(clock):
    done = enqueue.enqueue_declared(
        task_name="tests.testapp.tasks.ft_mail", now=clock.now(), message="by hand",
        queue="bulk", priority=7, retry={"max_attempts": 9},
    )  # fmt: skip
    run = Run.objects.get(pk=done.pk)
    assert (run.queue, run.priority) == ("bulk", 7)
    assert RetryPolicy.from_json(run.retry_policy) == RetryPolicy(max_attempts=9, base=1, cap=60)


def test_a_plain_task_gets_the_distsched_defaults(clock, settings):
    settings.DISTSCHED = {"MAX_ATTEMPTS": 4, "RETRY_BASE_SECONDS": 2, "RETRY_MAX_SECONDS": 20}
    done = enqueue.enqueue_declared(task_name="tests.noop", now=clock.now(), message="by hand")
    run = Run.objects.get(pk=done.pk)
    assert (run.queue, run.priority) == ("default", 0)
    assert RetryPolicy.from_json(run.retry_policy) == RetryPolicy(max_attempts=4, base=2, cap=20)


def test_a_queue_outside_the_backends_queues_is_refused_and_writes_nothing(clock, settings):
    settings.TASKS = {**settings.TASKS, "default": {**settings.TASKS["default"], "QUEUES": ["default", "urgent"]}}
    with pytest.raises(ValidationError) as refused:
        enqueue.enqueue_declared(
            task_name="tests.testapp.tasks.ft_add", now=clock.now(), message="by hand", queue="elsewhere"
        )
    assert refused.value.field == "queue" and "default, urgent" in str(refused.value)
    assert not Run.objects.exists() and not RunEvent.objects.exists()
    done = enqueue.enqueue_declared(
        task_name="tests.testapp.tasks.ft_add", now=clock.now(), message="ok", queue="urgent"
    )
    assert Run.objects.get(pk=done.pk).queue == "urgent"


@pytest.mark.parametrize("key", ["", "k"])
def test_an_enqueue_is_one_statement_but_sqlite_with_a_unique_key(clock, key, django_assert_num_queries):
    """PostgreSQL: the function call. SQLite: one INSERT into the enqueue view (migration 0028),
    whose trigger writes the run and its event; with a key, the run's INSERT then the event's."""
    with django_assert_num_queries(2 if key and connection.vendor == "sqlite" else 1):
        done = enqueue.enqueue(enqueue.Job(task_name="tests.noop", unique_key=key), now=clock.now(), message="m")
    [event] = RunEvent.objects.all()
    assert (event.run_id, event.event_type, event.message, event.created_at) == (
        done.pk,
        EventType.CREATED,
        "m",
        clock.now(),
    )


@pytest.mark.django_db(transaction=True)
def test_an_enqueue_outside_a_transaction_commits_the_run_with_its_event(clock):
    assert connection.get_autocommit() and not connection.in_atomic_block
    done = enqueue.enqueue(enqueue.Job(task_name="tests.noop"), now=clock.now())
    assert not connection.in_atomic_block
    assert list(RunEvent.objects.values_list("run_id", "event_type")) == [(done.pk, EventType.CREATED)]
    assert Run.objects.get().idempotency_key == f"enqueued:{done.pk}"


def test_a_rolled_back_caller_keeps_neither_the_run_nor_its_event(clock):
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue.enqueue(enqueue.Job(task_name="tests.noop"), now=clock.now())
        raise RuntimeError
    assert not Run.objects.exists() and not RunEvent.objects.exists()
