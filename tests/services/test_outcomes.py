"""Fenced outcomes: success, failure with backoff, dead, lease renewal, lease loss."""

from __future__ import annotations

from datetime import timedelta

import pytest

from distsched_app.models import EventType, Run, RunEvent, RunState
from distsched_app.services import claiming, outcomes
from tests.conftest import T0
from tests.factories import renew, succeed

pytestmark = pytest.mark.django_db


def history(run) -> list[str]:
    return list(RunEvent.objects.filter(run=run).order_by("id").values_list("event_type", flat=True))


@pytest.fixture
def claimed(scheduler, make_schedule, clock):
    def make(worker="A", lease=30, **options):
        make_schedule("o", **options)
        scheduler.tick()
        return claiming.claim_next_run(worker_id=worker, queues=None, lease_seconds=lease, now=clock.now())

    return make


def test_success_clears_lease_and_records_event(claimed, clock):
    run = claimed()
    clock.advance(seconds=2)
    assert succeed(run.pk, worker_id="A", attempt=1, now=clock.now(), result={"n": 1})
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED
    assert run.finished_at == clock.now()
    assert (run.lease_owner, run.lease_expires_at) == ("", None)
    assert run.result == {"n": 1}
    assert history(run)[-1] == "succeeded"
    clock.advance(days=1)
    assert claiming.claim_next_run(worker_id="B", queues=None, lease_seconds=30, now=clock.now()) is None


def test_failure_schedules_retry_with_backoff(claimed, clock):
    run = claimed(max_attempts=3, retry_base_seconds=10, retry_max_seconds=100)
    state = outcomes.record_failure(
        run_id=run.pk,
        worker_id="A",
        attempt=1,
        now=clock.now(),
        error="ValueError: boom",
        traceback_text="Traceback ...\nValueError: boom",
    )
    assert state == RunState.RETRYING
    run.refresh_from_db()
    assert run.attempts == 1
    assert run.available_at == T0 + timedelta(seconds=10)
    assert run.scheduled_for == T0  # the slot itself never moves
    assert run.last_error.startswith("ValueError: boom") and "Traceback" in run.last_error
    assert (run.lease_owner, run.lease_expires_at) == ("", None)
    assert history(run)[-2:] == ["failed", "retry_scheduled"]


def test_retries_back_off_then_die(claimed, clock):
    run = claimed(max_attempts=3, retry_base_seconds=10, retry_max_seconds=15)
    delays = []
    for attempt in (1, 2, 3):
        if attempt > 1:
            assert (
                claiming.claim_next_run(
                    worker_id="A", queues=None, lease_seconds=30, now=clock.now() - timedelta(seconds=1)
                )
                is None
            )
            run = claiming.claim_next_run(worker_id="A", queues=None, lease_seconds=30, now=clock.now())
            assert run.attempts == attempt
        state = outcomes.record_failure(run_id=run.pk, worker_id="A", attempt=attempt, now=clock.now(), error="boom")
        run.refresh_from_db()
        if state == RunState.RETRYING:
            delays.append((run.available_at - clock.now()).total_seconds())
            clock.set(run.available_at)
    assert delays == [10, 15]  # 10 * 2**0, min(10 * 2**1, 15)
    assert run.state == RunState.DEAD
    assert run.finished_at == clock.now()
    assert history(run)[-2:] == ["failed", "marked_dead"]


def test_jitter_is_added_to_the_delay(claimed, clock):
    run = claimed(retry_base_seconds=10, retry_jitter=0.5)
    outcomes.record_failure(run_id=run.pk, worker_id="A", attempt=1, now=clock.now(), error="x", rand=lambda: 0.5)
    run.refresh_from_db()
    assert run.available_at == T0 + timedelta(seconds=12.5)


def test_zombie_cannot_record_success_after_takeover(claimed, clock):
    run = claimed(lease=10)
    clock.advance(seconds=11)
    taken = claiming.claim_next_run(worker_id="B", queues=None, lease_seconds=10, now=clock.now())
    assert taken.pk == run.pk
    assert not succeed(run.pk, worker_id="A", attempt=1, now=clock.now())
    assert outcomes.record_failure(run_id=run.pk, worker_id="A", attempt=1, now=clock.now(), error="x") is None
    run.refresh_from_db()
    assert (run.state, run.lease_owner, run.attempts) == (RunState.RUNNING, "B", 2)
    lost = RunEvent.objects.filter(run=run, event_type=EventType.LEASE_LOST)
    assert lost.count() == 2 and {e.worker_id for e in lost} == {"A"}
    assert succeed(run.pk, worker_id="B", attempt=2, now=clock.now())


def test_same_worker_old_attempt_is_fenced(claimed, clock):
    run = claimed(lease=10)
    clock.advance(seconds=11)
    claiming.claim_next_run(worker_id="A", queues=None, lease_seconds=10, now=clock.now())  # attempt 2, same id
    assert not succeed(run.pk, worker_id="A", attempt=1, now=clock.now())
    assert Run.objects.get(pk=run.pk).state == RunState.RUNNING


def test_lease_renewal_keeps_a_long_task(claimed, clock):
    run = claimed(lease=10)
    for _ in range(5):
        clock.advance(seconds=8)
        assert renew(run.pk, worker_id="A", attempt=1, now=clock.now(), lease_seconds=10)
        assert claiming.claim_next_run(worker_id="B", queues=None, lease_seconds=10, now=clock.now()) is None
    run.refresh_from_db()
    assert run.lease_expires_at == clock.now() + timedelta(seconds=10)


def test_renewal_by_a_worker_that_lost_the_lease_fails(claimed, clock):
    run = claimed(lease=10)
    clock.advance(seconds=11)
    claiming.claim_next_run(worker_id="B", queues=None, lease_seconds=10, now=clock.now())
    assert not renew(run.pk, worker_id="A", attempt=1, now=clock.now(), lease_seconds=10)


def test_truncate_error_keeps_head_and_tail():
    text = "HEAD" + "x" * 50_000 + "TAIL"
    out = outcomes.truncate_error(text, limit=1000)
    assert len(out) <= 1000 + 60
    assert out.startswith("HEAD") and out.endswith("TAIL") and "truncated" in out


def test_a_batch_of_successes_keeps_each_runs_own_times_and_skips_a_lost_lease(make_schedule, scheduler, clock):
    """One UPDATE writes the batch (arrays joined by id on PostgreSQL, a CASE per run elsewhere):
    each run gets its own start and finish, and a run another worker took meanwhile is left alone."""
    for name in ("b1", "b2", "b3"):
        make_schedule(name)
    scheduler.tick()
    runs = claiming.claim_runs(worker_id="A", queues=None, lease_seconds=30, now=clock.now(), limit=3)
    assert len(runs) == 3
    Run.objects.filter(pk=runs[2].pk).update(lease_owner="B")  # taken over meanwhile
    times = {run.pk: (T0 + timedelta(seconds=i), T0 + timedelta(seconds=10 + i)) for i, run in enumerate(runs)}
    lost = outcomes.record_successes(
        worker_id="A",
        now=clock.now(),
        successes=[
            outcomes.Success(run_id=pk, attempt=1, started_at=started, finished_at=finished)
            for pk, (started, finished) in times.items()
        ],
    )
    assert lost == {runs[2].pk}
    for run in runs[:2]:
        run.refresh_from_db()
        assert (run.state, run.started_at, run.finished_at) == (RunState.SUCCEEDED, *times[run.pk])
        assert (run.lease_owner, run.lease_expires_at) == ("", None)
    runs[2].refresh_from_db()
    assert runs[2].state == RunState.LEASED and runs[2].lease_owner == "B" and runs[2].finished_at is None
