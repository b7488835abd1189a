"""Operator actions on runs: cancel (at once or cooperative) and requeue."""

from __future__ import annotations

import pytest

from distsched_app import errors
from distsched_app.models import ACTIVE_STATES, EventType, Run, RunEvent, RunState
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


# -------------------------------------------------------------- requeue and unique keys


def _enqueue(clock, task_name: str = "tests.noop", key: str = "k"):
    from distsched_app.services import enqueue

    return enqueue.enqueue(enqueue.Job(task_name=task_name, unique_key=key), now=clock.now()).run


def test_requeue_refuses_a_unique_key_another_unfinished_run_holds(scheduler, clock):
    first = _enqueue(clock)
    scheduler.cancel_run(first.pk)
    second = _enqueue(clock)  # the key is free again once the first run finished
    with pytest.raises(errors.UniqueKeyTaken) as info:
        scheduler.requeue_run(first.pk)
    assert isinstance(info.value, errors.InvalidStateTransition)  # a conflict (HTTP 409)
    assert str(info.value) == (
        f"run {first.pk} cannot be requeued: unfinished run {second.pk} of task tests.noop holds its unique key 'k'"
    )
    first.refresh_from_db()
    assert first.state == RunState.CANCELLED and history(first)[-1] == "cancelled"
    assert Run.objects.filter(unique_key="k", state__in=ACTIVE_STATES).count() == 1
    # Once the holder is finished, the requeue goes through.
    scheduler.cancel_run(second.pk)
    assert scheduler.requeue_run(first.pk).state == RunState.PENDING


def test_requeue_keeps_a_unique_key_another_task_holds(scheduler, clock):
    first = _enqueue(clock, "tests.noop")
    scheduler.cancel_run(first.pk)
    _enqueue(clock, "tests.echo")  # the same key, another task: no conflict
    assert scheduler.requeue_run(first.pk).state == RunState.PENDING
    assert Run.objects.filter(unique_key="k", state__in=ACTIVE_STATES).count() == 2


def test_a_holder_that_appears_after_the_check_is_the_same_typed_error(scheduler, clock, monkeypatch):
    """The race: another enqueue commits the key between the check and the UPDATE. The
    constraint decides, and its IntegrityError becomes the domain error (never a 500)."""
    from distsched_app.services import runs

    first = _enqueue(clock)
    scheduler.cancel_run(first.pk)
    second = _enqueue(clock)
    real, looks = runs._key_holder, []

    def late(run):  # the holder commits just after the check: the first look sees nothing
        looks.append(run.pk)
        return None if len(looks) == 1 else real(run)

    monkeypatch.setattr(runs, "_key_holder", late)
    with pytest.raises(errors.UniqueKeyTaken, match=f"unfinished run {second.pk} of task tests.noop"):
        scheduler.requeue_run(first.pk)
    first.refresh_from_db()
    assert first.state == RunState.CANCELLED and history(first)[-1] == "cancelled"
    assert scheduler.cancel_run(second.pk).state == RunState.CANCELLED  # the connection is still usable


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_concurrent_holder_is_refused_by_the_database_not_a_500(scheduler, clock):
    """The real race on PostgreSQL: another transaction makes a run holding the key unfinished
    but has not committed when the requeue checks; the requeue's UPDATE waits on the unique index
    until that commits, and the violation becomes ``UniqueKeyTaken``."""
    import threading

    from django.db import connection, connections

    first = _enqueue(clock)
    scheduler.cancel_run(first.pk)
    second = _enqueue(clock)
    scheduler.cancel_run(second.pk)
    other = connections.create_connection("default")
    outcome: list[BaseException | object] = []

    def requeue() -> None:
        try:
            outcome.append(scheduler.requeue_run(first.pk))
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            outcome.append(exc)
        finally:
            connections["default"].close()

    try:
        other.set_autocommit(False)
        with other.cursor() as cursor:
            cursor.execute("UPDATE distsched_app_run SET state = 'pending' WHERE id = %s", [second.pk])
        thread = threading.Thread(target=requeue)
        thread.start()
        with connection.cursor() as cursor:  # until the requeue's UPDATE waits for the other transaction
            for _ in range(200):
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
                if cursor.fetchone()[0]:
                    break
                thread.join(0.05)
        other.commit()
        thread.join(10)
    finally:
        other.rollback()
        other.close()
    [error] = outcome
    assert isinstance(error, errors.UniqueKeyTaken), error
    assert f"unfinished run {second.pk} of task tests.noop" in str(error)
    assert Run.objects.get(pk=first.pk).state == RunState.CANCELLED
