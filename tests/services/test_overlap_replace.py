"""overlap="replace": a new slot's run cancels the schedule's earlier runs; one still executing is
asked to stop, and the new run is blocked behind it until it has ended or its lease expired."""

from __future__ import annotations

from datetime import timedelta

import pytest

from distsched_app.clock import iso_utc
from distsched_app.models import EventType, Run, RunEvent, RunState
from distsched_app.services import claiming, outcomes, replacement
from tests.conftest import T0

pytestmark = pytest.mark.django_db


def history(run) -> list[tuple[str, str]]:
    return list(RunEvent.objects.filter(run=run).order_by("id").values_list("event_type", "message"))


def kinds(run) -> list[str]:
    return [kind for kind, _ in history(run)]


def claim(clock, worker: str = "A", lease_seconds: float = 300) -> Run | None:
    return claiming.claim_next_run(worker_id=worker, queues=None, lease_seconds=lease_seconds, now=clock.now())


@pytest.fixture
def replacing(make_schedule):
    return make_schedule("r", interval_seconds=60, overlap="replace")


def test_a_waiting_earlier_run_is_cancelled_at_once(scheduler, replacing, clock):
    [first] = scheduler.tick()
    clock.advance(seconds=60)
    [second] = scheduler.tick()
    assert (second.state, second.held_by) == (RunState.PENDING, "")
    assert kinds(second) == [EventType.CREATED]
    first.refresh_from_db()
    assert (first.state, first.finished_at, first.cancel_requested) == (RunState.CANCELLED, clock.now(), False)
    by = f"run {second.pk} (slot {iso_utc(second.scheduled_for)})"
    assert history(first)[1:] == [
        (EventType.REPLACED, f"replaced by {by}"),
        (EventType.CANCELLED, f"cancelled by overlap=replace: replaced by {by}"),
    ]
    assert claim(clock).pk == second.pk


def test_a_retrying_earlier_run_is_cancelled_at_once(scheduler, replacing, clock):
    [first] = scheduler.tick()
    claim(clock)
    outcomes.record_failure(run_id=first.pk, worker_id="A", attempt=1, now=clock.now(), error="boom")
    assert Run.objects.get(pk=first.pk).state == RunState.RETRYING
    clock.advance(seconds=60)
    [second] = scheduler.tick()
    assert second.state == RunState.PENDING
    assert Run.objects.get(pk=first.pk).state == RunState.CANCELLED


def test_a_running_earlier_run_is_asked_to_stop_and_the_new_run_blocked(scheduler, replacing, clock):
    [first] = scheduler.tick()
    claim(clock)
    clock.advance(seconds=60)
    [second] = scheduler.tick()
    assert (second.state, second.held_by) == (RunState.BLOCKED, f"run:{first.pk}")
    assert history(second) == [
        (EventType.CREATED, ""),
        (EventType.BLOCKED, f"waiting for run {first.pk} (overlap=replace) to end"),
    ]
    first.refresh_from_db()
    assert (first.state, first.cancel_requested, first.finished_at) == (RunState.RUNNING, True, None)
    by = f"run {second.pk} (slot {iso_utc(T0 + timedelta(seconds=60))})"
    assert history(first)[-2:] == [
        (EventType.REPLACED, f"replaced by {by}"),
        (EventType.CANCEL_REQUESTED, f"cancel requested by overlap=replace: replaced by {by}"),
    ]
    # Blocked: no worker can claim it while the old run holds its lease.
    assert claim(clock, "B") is None


def test_release_makes_the_blocked_run_pending(scheduler, replacing, clock):
    [first] = scheduler.tick()
    claim(clock)
    clock.advance(seconds=60)
    [second] = scheduler.tick()
    clock.advance(seconds=5)
    assert replacement.release_replacements([first.pk + 1000], clock.now()) == []  # not what it waits for
    assert replacement.release_replacements([first.pk], clock.now()) == [second.pk]
    second.refresh_from_db()
    assert (second.state, second.held_by, second.available_at) == (RunState.PENDING, "", clock.now())
    assert second.updated_at == clock.now()
    assert history(second)[-1] == (EventType.UNBLOCKED, f"run {first.pk} it replaces has ended")
    assert replacement.release_replacements([first.pk], clock.now()) == []  # once only


@pytest.mark.parametrize("ending", ["cancelled", "succeeded"])
def test_the_old_run_ending_lets_the_new_one_start(scheduler, replacing, clock, ending):
    """The real path: the old run is claimed, told to stop, and ends (its task raised RunCancelled,
    or finished anyway); the release in its transaction (called here explicitly as well: idempotent)
    makes the new run claimable."""
    [first] = scheduler.tick()
    claimed = claim(clock)
    assert claimed is not None and claimed.pk == first.pk
    clock.advance(seconds=60)
    [second] = scheduler.tick()
    clock.advance(seconds=1)
    if ending == "cancelled":
        state = outcomes.record_failure(
            run_id=first.pk, worker_id="A", attempt=1, now=clock.now(), error="RunCancelled", cancelled=True
        )
        assert state == RunState.CANCELLED
    else:
        success = outcomes.Success(run_id=first.pk, attempt=1, started_at=T0, finished_at=clock.now())
        assert outcomes.record_successes(worker_id="A", successes=[success], now=clock.now()) == set()
    replacement.release_replacements([first.pk], clock.now())  # until the outcome hook does it
    assert Run.objects.get(pk=first.pk).state == ending
    second.refresh_from_db()
    assert (second.state, second.held_by) == (RunState.PENDING, "")
    assert kinds(second).count(EventType.UNBLOCKED) == 1
    assert claim(clock, "B").pk == second.pk


def test_sweep_releases_once_the_old_lease_expired(scheduler, replacing, clock):
    [first] = scheduler.tick()
    claim(clock, lease_seconds=300)
    clock.advance(seconds=60)
    [second] = scheduler.tick()
    assert replacement.sweep_replacements(clock.now()) == 0  # the old run still holds its lease
    assert Run.objects.get(pk=second.pk).state == RunState.BLOCKED
    clock.set(T0 + timedelta(seconds=300))  # the old worker died: its lease ends now
    assert replacement.sweep_replacements(clock.now()) == 1
    second.refresh_from_db()
    assert (second.state, second.held_by) == (RunState.PENDING, "")
    assert history(second)[-1] == (
        EventType.UNBLOCKED,
        f"run {first.pk} it replaces no longer executes (it ended, or its lease expired)",
    )
    assert replacement.sweep_replacements(clock.now()) == 0
    # The old run's recovery cancels it (its cancel was requested) instead of running it again.
    clock.advance(seconds=1)
    assert claim(clock, "B").pk == second.pk
    assert Run.objects.get(pk=first.pk).state == RunState.CANCELLED


def test_sweep_releases_runs_whose_old_run_already_ended_or_is_gone(scheduler, replacing, clock):
    [first] = scheduler.tick()
    claim(clock)
    clock.advance(seconds=60)
    [second] = scheduler.tick()
    # A release the outcome's transaction missed: the old run ended without it.
    Run.objects.filter(pk=first.pk).update(state=RunState.SUCCEEDED, lease_owner="", lease_expires_at=None)
    assert replacement.sweep_replacements(clock.now()) == 1
    assert Run.objects.get(pk=second.pk).state == RunState.PENDING
    # A run blocked behind a run that no longer exists.
    Run.objects.filter(pk=second.pk).update(state=RunState.BLOCKED, held_by="run:999999")
    assert replacement.sweep_replacements(clock.now()) == 1
    assert Run.objects.get(pk=second.pk).state == RunState.PENDING


def test_an_old_run_whose_lease_already_expired_does_not_block_the_new_one(scheduler, replacing, clock):
    [first] = scheduler.tick()
    claim(clock, lease_seconds=30)
    clock.advance(seconds=60)  # the lease ended 30 s ago, not yet recovered
    [second] = scheduler.tick()
    assert (second.state, second.held_by) == (RunState.PENDING, "")
    assert Run.objects.get(pk=first.pk).cancel_requested  # its recovery cancels it
    [recovered] = claiming.claim_runs(worker_id="B", queues=None, lease_seconds=30, now=clock.now(), limit=1)
    assert recovered.pk == second.pk
    assert Run.objects.get(pk=first.pk).state == RunState.CANCELLED


def test_catch_up_slots_of_one_tick_keep_only_the_last(scheduler, make_schedule, clock):
    make_schedule("all", interval_seconds=600, catch_up="all", overlap="replace")
    [first] = scheduler.tick()
    clock.advance(seconds=1800)  # slots +10, +20 and +30 min are due
    created = scheduler.tick()
    assert [(r.scheduled_for, r.state) for r in created] == [
        (T0 + timedelta(minutes=10), RunState.SKIPPED),
        (T0 + timedelta(minutes=20), RunState.SKIPPED),
        (T0 + timedelta(minutes=30), RunState.PENDING),
    ]
    last = iso_utc(T0 + timedelta(minutes=30))
    assert history(created[0])[-1] == (
        EventType.SKIPPED,
        f"the later slot {last} of the same tick replaces it (overlap=replace)",
    )
    assert created[0].finished_at == clock.now()
    first.refresh_from_db()
    assert first.state == RunState.CANCELLED
    assert history(first)[-2] == (EventType.REPLACED, f"replaced by run {created[-1].pk} (slot {last})")


def test_catch_up_slots_behind_a_running_run(scheduler, make_schedule, clock):
    make_schedule("all", interval_seconds=600, catch_up="all", overlap="replace")
    [first] = scheduler.tick()
    claim(clock, lease_seconds=3600)
    clock.advance(seconds=1200)
    skipped, blocked = scheduler.tick()
    assert skipped.state == RunState.SKIPPED
    assert (blocked.state, blocked.held_by) == (RunState.BLOCKED, f"run:{first.pk}")
    assert kinds(first).count(EventType.REPLACED) == 1  # by the surviving run only


def test_a_blocked_replacement_is_itself_replaced(scheduler, replacing, clock):
    [first] = scheduler.tick()
    claim(clock)
    clock.advance(seconds=60)
    [second] = scheduler.tick()
    clock.advance(seconds=60)
    [third] = scheduler.tick()
    assert (third.state, third.held_by) == (RunState.BLOCKED, f"run:{first.pk}")
    second.refresh_from_db()
    assert (second.state, second.held_by) == (RunState.CANCELLED, "")
    assert kinds(second)[-2:] == [EventType.REPLACED, EventType.CANCELLED]
    # The old run was replaced twice, but asked to stop once.
    assert kinds(first).count(EventType.REPLACED) == 2
    assert kinds(first).count(EventType.CANCEL_REQUESTED) == 1
    assert replacement.release_replacements([first.pk], clock.now()) == [third.pk]


def test_several_earlier_runs_executing_the_new_run_waits_for_each(scheduler, make_schedule, clock):
    """Runs left by overlap=allow: the new run waits for the newest, then for the other."""
    make_schedule("m", interval_seconds=60)
    [a] = scheduler.tick()
    claim(clock, "A")
    clock.advance(seconds=60)
    [b] = scheduler.tick()
    claim(clock, "B")
    scheduler.update_schedule("m", overlap="replace")
    clock.set(T0 + timedelta(seconds=120))
    [new] = scheduler.tick()
    assert (new.state, new.held_by) == (RunState.BLOCKED, f"run:{b.pk}")
    assert all(Run.objects.filter(pk__in=[a.pk, b.pk]).values_list("cancel_requested", flat=True))
    outcomes.record_failure(run_id=b.pk, worker_id="B", attempt=1, now=clock.now(), error="x", cancelled=True)
    replacement.release_replacements([b.pk], clock.now())
    new.refresh_from_db()
    assert (new.state, new.held_by) == (RunState.BLOCKED, f"run:{a.pk}")
    assert history(new)[-1] == (EventType.BLOCKED, f"waiting for run {a.pk} (overlap=replace) to end")
    outcomes.record_failure(run_id=a.pk, worker_id="A", attempt=1, now=clock.now(), error="x", cancelled=True)
    replacement.release_replacements([a.pk], clock.now())
    assert Run.objects.get(pk=new.pk).state == RunState.PENDING


def test_an_operator_cancels_a_blocked_run_at_once(scheduler, replacing, clock):
    [first] = scheduler.tick()
    claim(clock)
    clock.advance(seconds=60)
    [second] = scheduler.tick()
    run = scheduler.cancel_run(second.pk)
    assert (run.state, run.finished_at, run.held_by) == (RunState.CANCELLED, clock.now(), "")
    assert history(run)[-1] == (EventType.CANCELLED, "cancelled by code")
    assert replacement.release_replacements([first.pk], clock.now()) == []  # nothing waits any more
    assert replacement.sweep_replacements(clock.now()) == 0


def test_a_manual_trigger_is_replaced_like_a_slot(scheduler, replacing, clock):
    """Every active run of the schedule is an earlier run, also one an operator triggered."""
    [first] = scheduler.tick()
    manual = scheduler.trigger("r")
    clock.advance(seconds=60)
    [second] = scheduler.tick()
    assert second.state == RunState.PENDING
    states = dict(Run.objects.filter(pk__in=[first.pk, manual.pk]).values_list("id", "state"))
    assert states == {first.pk: RunState.CANCELLED, manual.pk: RunState.CANCELLED}


def test_overlap_replace_leaves_other_schedules_alone(scheduler, replacing, make_schedule, clock):
    make_schedule("other", interval_seconds=60)
    first_r, first_other = scheduler.tick()
    clock.advance(seconds=60)
    scheduler.tick()
    assert Run.objects.get(pk=first_other.pk).state == RunState.PENDING
    assert Run.objects.get(pk=first_r.pk).state == RunState.CANCELLED


def test_holder_labels():
    assert replacement.holder(12) == "run:12"
    assert replacement.holder_id("run:12") == 12
    assert replacement.holder_id("limit:billing:acct") is None
    assert replacement.holder_id("run:x") is None


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_release_wakes_the_blocked_runs_queue_at_commit(scheduler, replacing, clock):
    from django.db import transaction

    from distsched_app.db import notify
    from tests.concurrency.procs import received

    [first] = scheduler.tick()
    claim(clock)
    clock.advance(seconds=60)
    scheduler.tick()
    listening = notify.Listener(notify.conninfo())
    try:
        with transaction.atomic():
            replacement.release_replacements([first.pk], clock.now())
            assert listening.wait(0.3) == []  # not before the commit
        assert received(listening) == ["default"]
    finally:
        listening.close()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_tick_waits_for_a_worker_recording_the_old_runs_outcome(scheduler, replacing, clock):
    """The tick locks the earlier runs (FOR UPDATE): while another transaction ends the old run,
    the tick waits and then sees it ended, so it neither cancels a finished run nor blocks the
    new one behind it."""
    import threading

    from django.db import connection, connections

    [first] = scheduler.tick()
    claim(clock)
    clock.advance(seconds=60)
    other = connections.create_connection("default")
    outcome: list[BaseException | object] = []

    def tick() -> None:
        try:
            outcome.append(scheduler.tick())
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            outcome.append(exc)
        finally:
            connections["default"].close()

    try:
        other.set_autocommit(False)
        with other.cursor() as cursor:
            cursor.execute(
                "UPDATE distsched_app_run SET state = 'succeeded', lease_owner = '', lease_expires_at = NULL "
                "WHERE id = %s",
                [first.pk],
            )
        thread = threading.Thread(target=tick)
        thread.start()
        with connection.cursor() as cursor:  # until the tick waits for the other transaction
            for _ in range(200):
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
                if cursor.fetchone()[0]:
                    break
                thread.join(0.05)
            else:
                pytest.fail("the tick did not wait for the run's lock")
        other.commit()
        thread.join(10)
    finally:
        other.rollback()
        other.close()
    [created] = outcome
    assert isinstance(created, list), created
    [second] = created
    assert (second.state, second.held_by) == (RunState.PENDING, "")
    assert EventType.REPLACED not in kinds(first)
