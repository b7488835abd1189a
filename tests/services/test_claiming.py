"""Claiming without execution: ownership, leases, expiry and recovery."""

from __future__ import annotations

from datetime import timedelta

import pytest

from distsched_app.models import EventType, Run, RunEvent, RunState
from distsched_app.services import claiming
from tests.conftest import T0

pytestmark = pytest.mark.django_db


def claim(clock, worker="A", lease=30, queues=None):
    return claiming.claim_next_run(worker_id=worker, queues=queues, lease_seconds=lease, now=clock.now())


def history(run) -> list[str]:
    return list(RunEvent.objects.filter(run=run).order_by("id").values_list("event_type", flat=True))


def test_claim_takes_ownership(scheduler, make_schedule, clock):
    make_schedule("c")
    scheduler.tick()
    run = claim(clock)
    run.refresh_from_db()
    assert run.state == RunState.RUNNING
    assert run.lease_owner == "A"
    assert run.lease_expires_at == T0 + timedelta(seconds=30)
    assert run.attempts == 1
    assert run.started_at == T0
    assert history(run) == ["created", "claimed", "started"]


def test_nothing_due_returns_none(scheduler, make_schedule, clock):
    make_schedule("f", start_at=T0 + timedelta(minutes=5))
    scheduler.tick()
    assert claim(clock) is None


def test_two_workers_compete_for_one_run(scheduler, make_schedule, clock):
    make_schedule("c")
    scheduler.tick()
    first = claim(clock, "A", lease=30)
    assert first is not None
    assert claim(clock, "B") is None  # held by A
    clock.advance(seconds=29)
    assert claim(clock, "B") is None  # lease not yet expired
    clock.advance(seconds=1)
    second = claim(clock, "B")
    assert second is not None and second.pk == first.pk
    second.refresh_from_db()
    assert (second.lease_owner, second.attempts) == ("B", 2)
    assert history(second) == ["created", "claimed", "started", "lease_expired", "claimed", "started"]
    expired = RunEvent.objects.get(run=second, event_type=EventType.LEASE_EXPIRED)
    assert expired.worker_id == "A" and expired.attempt == 1


def test_expired_lease_with_no_attempts_left_is_dead_not_rerun(scheduler, make_schedule, clock):
    make_schedule("c", max_attempts=1)
    scheduler.tick()
    claim(clock, "A", lease=10)
    clock.advance(seconds=11)
    assert claim(clock, "B") is None
    run = Run.objects.get()
    assert run.state == RunState.DEAD
    assert run.finished_at == clock.now()
    assert history(run)[-2:] == ["lease_expired", "marked_dead"]


def test_expired_lease_of_cancel_requested_run_is_cancelled(scheduler, make_schedule, clock):
    make_schedule("c")
    scheduler.tick()
    run = claim(clock, "A", lease=10)
    scheduler.cancel_run(run.pk)
    clock.advance(seconds=11)
    assert claim(clock, "B") is None
    run.refresh_from_db()
    assert run.state == RunState.CANCELLED
    assert history(run)[-2:] == ["lease_expired", "cancelled"]


def test_oldest_slot_first(scheduler, clock):
    scheduler.create_schedule(name="late", task_name="tests.noop", run_at=T0 + timedelta(seconds=20))
    scheduler.create_schedule(name="early", task_name="tests.noop", run_at=T0 + timedelta(seconds=10))
    clock.advance(seconds=30)
    scheduler.tick()
    assert claim(clock).schedule.name == "early"
    assert claim(clock).schedule.name == "late"


def test_queues_filter(scheduler, make_schedule, clock):
    make_schedule("mail", queue="emails")
    scheduler.tick()
    assert claim(clock, queues=["default"]) is None
    assert claim(clock, queues=["default", "emails"]) is not None


def test_claim_batch_takes_distinct_runs(scheduler, clock):
    for i in range(5):
        scheduler.create_schedule(name=f"b{i}", task_name="tests.noop", interval_seconds=60)
    scheduler.tick()
    runs = claiming.claim_runs(worker_id="A", queues=None, lease_seconds=30, now=clock.now(), limit=3)
    assert len({r.pk for r in runs}) == 3
    # The first starts now; the others are prefetched, each with its own lease and attempt.
    assert Run.objects.filter(state=RunState.RUNNING).count() == 1
    assert Run.objects.filter(state=RunState.LEASED, lease_owner="A", attempts=1).count() == 2
    assert Run.objects.filter(state=RunState.PENDING).count() == 2
    assert RunEvent.objects.filter(event_type=EventType.CLAIMED).count() == 3
    assert RunEvent.objects.filter(event_type=EventType.STARTED).count() == 1


def test_prefetched_leased_run_is_recovered_after_lease_expiry(scheduler, clock):
    for i in range(2):
        scheduler.create_schedule(name=f"b{i}", task_name="tests.noop", interval_seconds=60)
    scheduler.tick()
    claiming.claim_runs(worker_id="A", queues=None, lease_seconds=10, now=clock.now(), limit=2)
    clock.advance(seconds=10)
    recovered = claiming.claim_runs(worker_id="B", queues=None, lease_seconds=10, now=clock.now(), limit=2)
    assert len(recovered) == 2 and {r.attempts for r in recovered} == {2}
    assert RunEvent.objects.filter(event_type=EventType.LEASE_EXPIRED).count() == 2


def test_claimed_run_is_never_claimed_again_while_leased(scheduler, make_schedule, clock):
    make_schedule("c")
    scheduler.tick()
    claim(clock, "A", lease=60)
    for w in "BCDE":
        assert claim(clock, w) is None


def test_next_due_reports_earliest_waiting_run_and_schedule(scheduler, clock):
    scheduler.create_schedule(name="soon", task_name="tests.noop", run_at=T0 + timedelta(seconds=30))
    scheduler.create_schedule(
        name="later", task_name="tests.noop", interval_seconds=60, start_at=T0 + timedelta(seconds=90)
    )
    scheduler.create_schedule(
        name="elsewhere",
        task_name="tests.noop",
        interval_seconds=60,
        queue="other",
        start_at=T0 + timedelta(seconds=10),
    )
    due = claiming.next_due(queues=["default"])
    assert (due.run, due.schedule) == (None, T0 + timedelta(seconds=30))
    clock.advance(seconds=30)
    scheduler.tick()
    due = claiming.next_due(queues=["default"])
    assert (due.run, due.schedule) == (T0 + timedelta(seconds=30), T0 + timedelta(seconds=90))
    assert claiming.next_due(queues=["other"]).run == T0 + timedelta(seconds=10)  # its own queue only


def test_prefetched_run_of_a_dead_worker_keeps_its_attempt_budget(scheduler, clock):
    for i in range(2):
        scheduler.create_schedule(name=f"p{i}", task_name="tests.noop", interval_seconds=3600, max_attempts=1)
    scheduler.tick()
    # Worker A claims both (the second only prefetched), then dies.
    first, second = claiming.claim_runs(worker_id="A", queues=None, lease_seconds=10, now=clock.now(), limit=2)
    clock.advance(seconds=10)
    recovered = claiming.claim_runs(worker_id="B", queues=None, lease_seconds=10, now=clock.now(), limit=2)
    # The running one had no attempts left: dead. The prefetched one is run again, budget extended.
    assert [r.pk for r in recovered] == [second.pk]
    second.refresh_from_db()
    first.refresh_from_db()
    assert first.state == RunState.DEAD
    assert (second.attempts, second.max_attempts, second.state) == (2, 2, RunState.RUNNING)
    note = RunEvent.objects.filter(run=second, event_type=EventType.LEASE_EXPIRED).get().message
    assert "not counted" in note


def test_uncounted_expiries_are_bounded(scheduler, clock):
    # A run that keeps killing the worker that prefetched it must still end dead.
    scheduler.create_schedule(name="poison", task_name="tests.noop", interval_seconds=3600, max_attempts=1)
    scheduler.tick()
    claiming.claim_next_run(worker_id="W", queues=None, lease_seconds=10, now=clock.now())
    for _ in range(claiming.MAX_UNCOUNTED_EXPIRIES + 1):
        # Its worker dies while the run is only prefetched (state leased).
        Run.objects.update(state=RunState.LEASED, lease_expires_at=clock.now())
        clock.advance(seconds=1)
        claiming.claim_next_run(worker_id="W", queues=None, lease_seconds=10, now=clock.now())
    run = Run.objects.get()
    assert run.state == RunState.DEAD
    assert run.attempts == 1 + claiming.MAX_UNCOUNTED_EXPIRIES
    assert RunEvent.objects.filter(run=run, event_type=EventType.LEASE_EXPIRED).count() == 4
