"""Operator actions on runs: cancel (at once or cooperative) and requeue."""

from __future__ import annotations

import pytest

from distsched_app import errors
from distsched_app.models import EventType, RunEvent, RunState
from distsched_app.services import claiming, outcomes
from tests.factories import succeed

pytestmark = pytest.mark.django_db


def history(run) -> list[str]:
    return list(RunEvent.objects.filter(run=run).order_by("id").values_list("event_type", flat=True))


@pytest.fixture
def pending(scheduler, make_schedule):
    make_schedule("r", max_attempts=2)
    [run] = scheduler.tick()
    return run


def test_cancel_pending_is_immediate(scheduler, pending, clock):
    run = scheduler.cancel_run(pending.pk)
    assert run.state == RunState.CANCELLED and run.finished_at == clock.now()
    assert history(run)[-1] == "cancelled"
    assert claiming.claim_next_run(worker_id="A", queues=None, lease_seconds=30, now=clock.now()) is None


def test_cancel_running_is_cooperative(scheduler, pending, clock):
    claiming.claim_next_run(worker_id="A", queues=None, lease_seconds=30, now=clock.now())
    run = scheduler.cancel_run(pending.pk)
    assert run.state == RunState.RUNNING and run.cancel_requested
    assert history(run)[-1] == "cancel_requested"
    # A failure after the request ends cancelled, never retrying.
    state = outcomes.record_failure(run_id=run.pk, worker_id="A", attempt=1, now=clock.now(), error="x")
    assert state == RunState.CANCELLED


def test_cancel_requested_then_returned_normally_is_succeeded(scheduler, pending, clock):
    claiming.claim_next_run(worker_id="A", queues=None, lease_seconds=30, now=clock.now())
    scheduler.cancel_run(pending.pk)
    assert succeed(
        pending.pk, worker_id="A", attempt=1, now=clock.now(), note="returned normally after a cancel request"
    )
    pending.refresh_from_db()
    assert pending.state == RunState.SUCCEEDED
    assert RunEvent.objects.get(run=pending, event_type=EventType.SUCCEEDED).message.startswith("returned")


def test_cancel_finished_run_is_a_state_error(scheduler, pending, clock):
    claiming.claim_next_run(worker_id="A", queues=None, lease_seconds=30, now=clock.now())
    succeed(pending.pk, worker_id="A", attempt=1, now=clock.now())
    with pytest.raises(errors.InvalidStateTransition):
        scheduler.cancel_run(pending.pk)


def test_requeue_dead_run_keeps_attempts_and_grants_budget(scheduler, pending, clock):
    for attempt in (1, 2):
        run = claiming.claim_next_run(worker_id="A", queues=None, lease_seconds=30, now=clock.now())
        outcomes.record_failure(run_id=run.pk, worker_id="A", attempt=attempt, now=clock.now(), error="x")
        run.refresh_from_db()
        clock.set(run.available_at)
    assert run.state == RunState.DEAD
    clock.advance(seconds=100)
    run = scheduler.requeue_run(run.pk)
    assert (run.state, run.attempts, run.max_attempts) == (RunState.PENDING, 2, 4)
    assert run.available_at == clock.now() and run.finished_at is None
    assert history(run)[-1] == "requeued"
    again = claiming.claim_next_run(worker_id="B", queues=None, lease_seconds=30, now=clock.now())
    assert again.pk == run.pk and again.attempts == 3  # the fencing token only grows


def test_requeue_cancelled_run(scheduler, pending):
    scheduler.cancel_run(pending.pk)
    assert scheduler.requeue_run(pending.pk).state == RunState.PENDING


def test_requeue_pending_run_is_a_state_error(scheduler, pending):
    with pytest.raises(errors.InvalidStateTransition):
        scheduler.requeue_run(pending.pk)


def test_unknown_run(scheduler):
    with pytest.raises(errors.RunNotFound):
        scheduler.cancel_run(999_999)
    with pytest.raises(errors.RunNotFound):
        scheduler.get_run(999_999)
