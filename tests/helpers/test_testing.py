"""``distsched_app.testing``: drain runs in-process inside a TestCase (its open transaction) and
outside, sync and async, on both databases; the fake clock; the pytest fixtures."""

from __future__ import annotations

import pytest
from django.test import TestCase

from distsched_app import Scheduler
from distsched_app.clock import current_clock
from distsched_app.models import Run, RunState
from distsched_app.registry import registry
from distsched_app.services import enqueue as enqueue_service
from distsched_app.testing import DrainLimitReached, UnknownTaskInTest, drain, fake_clock
from examples.demo.models import Invoice
from tests.testapp import tasks as t


class DrainInATestCase(TestCase):
    """Django's TestCase: everything happens inside one transaction that is rolled back."""

    def test_an_async_task_uses_the_tests_connection(self):
        result = t.ft_async_orm.enqueue(note="async")
        done = drain()
        assert (done.succeeded, done.errors) == (1, [])
        result.refresh()
        # Its ORM call (Run.objects.acount()) ran on the test's connection: it sees the uncommitted run.
        assert result.return_value == {"runs": 1, "note": "async", "fencing_token": f"{result.id}:1"}

    def test_a_sync_framework_task_with_distsched_context_extras(self):
        result = t.ft_context.enqueue(note="extras")
        drain()
        result.refresh()
        run = Run.objects.get(pk=int(result.id))
        assert result.status.name == "SUCCESSFUL"
        assert result.return_value["idempotency_key"] == run.idempotency_key
        assert result.return_value["fencing_token"] == f"{run.pk}:1"

    def test_due_schedules_are_ticked_and_run(self):
        with fake_clock("2026-03-02T09:00:00+00:00"):
            Scheduler().create_schedule(
                name="billing",
                task_name="demo.billing_sync",
                kwargs={"account_id": 7, "amount_cents": 100},
                interval_seconds=3600,
            )
            done = drain()
        assert (done.created, done.succeeded) == (1, 1)
        assert Invoice.objects.get().account_id == 7

    def test_retries_wait_for_the_fake_clock(self):
        with fake_clock("2026-03-02T09:00:00+00:00") as clock:
            Scheduler().create_schedule(
                name="f", task_name="tests.fail", interval_seconds=3600, max_attempts=2, retry_base_seconds=10
            )
            first = drain()
            assert (first.retrying, first.errors) == (1, ["ValueError: boom"])
            assert drain().executions == []  # the backoff has not passed
            clock.advance(seconds=10)
            assert drain().dead == 1


@pytest.mark.django_db
def test_drain_outside_a_test_case_and_async_too():
    result = t.ft_async.enqueue(21)
    assert drain().succeeded == 1
    result.refresh()
    assert result.return_value == 42


@pytest.mark.django_db
def test_a_run_of_an_unregistered_task_is_an_error_in_a_test():
    registry.register("tests.gone", lambda: None)
    enqueue_service.enqueue(enqueue_service.Job(task_name="tests.gone"), now=current_clock().now())
    registry.unregister("tests.gone")
    with pytest.raises(UnknownTaskInTest, match=r"no task registered as tests\.gone"):
        drain()


@pytest.mark.django_db
def test_a_task_that_keeps_enqueuing_is_stopped_at_max_runs():
    def again() -> None:
        enqueue_service.enqueue(enqueue_service.Job(task_name="tests.again"), now=current_clock().now())

    registry.register("tests.again", again)
    try:
        again()
        with pytest.raises(DrainLimitReached, match="drain executed 5 runs and more are due"):
            drain(max_runs=5)
    finally:
        registry.unregister("tests.again")


@pytest.mark.django_db
def test_only_the_given_queues_are_drained():
    t.ft_add.using(queue_name="emails").enqueue(1, 2)
    t.ft_add.enqueue(3, 4)
    assert drain(queues=["default"]).succeeded == 1
    assert Run.objects.filter(queue="emails", state=RunState.PENDING).count() == 1


def test_the_fixtures_give_a_fake_clock_and_a_bound_drain(distsched_clock, distsched_drain, db):
    assert current_clock() is distsched_clock
    Scheduler().create_schedule(name="h", task_name="demo.heartbeat", interval_seconds=60)
    assert distsched_drain().succeeded == 1
    assert distsched_drain().executions == []  # the next slot is a minute away
    distsched_clock.advance(seconds=60)
    assert distsched_drain().succeeded == 1
