"""A worker never dies of an outcome it cannot record.

Failures of several kinds are injected into each recording path (success,
failure, lease renewal, the start of a prefetched run, the release of unstarted
runs, the event insert inside an outcome). Each time the worker logs the run
id, keeps serving, and the run keeps its lease; once that expires another
worker recovers the run, and its history says why it ran again.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.db import DatabaseError, DataError, IntegrityError

from distsched_app.models import EventType, Run, RunEvent, RunState
from distsched_app.services import events, outcomes
from tests.testapp import tasks as test_tasks

pytestmark = pytest.mark.django_db

LEASE = 30


def boom(kind: str) -> BaseException:
    return {
        "database-error": DatabaseError("the database refused the write"),
        "data-error": DataError("value too long for type character varying(200)"),
        "integrity-error": IntegrityError("duplicate key value violates unique constraint"),
        "unicode": UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"),
        "type-error": TypeError("Object of type bytes is not JSON serializable"),
        "bug": RuntimeError("a bug in the recording path"),
    }[kind]


KINDS = ["database-error", "data-error", "integrity-error", "unicode", "type-error", "bug"]


def failing_once(monkeypatch, module, name: str, exc: BaseException) -> list[int]:
    """Make ``module.name`` raise ``exc`` on its first call only; returns the call counter."""
    real = getattr(module, name)
    calls = [0]

    def fake(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 1:
            raise exc
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, fake)
    return calls


def two_runs(scheduler, first_task: str = "tests.noop", **first_kwargs) -> tuple[Run, Run]:
    scheduler.create_schedule(
        name="a-first",
        task_name=first_task,
        interval_seconds=3600,
        kwargs=first_kwargs,
        max_attempts=3,
        retry_base_seconds=0,
        retry_max_seconds=0,
    )
    scheduler.create_schedule(name="b-second", task_name="tests.noop", interval_seconds=3600)
    scheduler.tick()
    return Run.objects.get(schedule__name="a-first"), Run.objects.get(schedule__name="b-second")


def history(run: Run) -> list[str]:
    return list(RunEvent.objects.filter(run=run).order_by("id").values_list("event_type", flat=True))


def serve_both(scheduler) -> int:
    worker = scheduler.worker(worker_id="w1", lease_seconds=LEASE, heartbeat_seconds=3600, prefetch=1)
    return worker.run(max_runs=2, burst=True, install_signals=False)


def assert_recovered_later(scheduler, clock, run: Run, expected_state: str) -> None:
    """The run kept w1's lease; after it expires, w2 executes it again and records the outcome."""
    run.refresh_from_db()
    assert run.lease_owner == "w1" and run.state in (RunState.RUNNING, RunState.LEASED)
    clock.advance(seconds=LEASE + 1)
    scheduler.worker(worker_id="w2", lease_seconds=LEASE, heartbeat_seconds=3600).run_once()
    run.refresh_from_db()
    assert run.state == expected_state and run.attempts == 2
    kinds = history(run)
    assert kinds.index(EventType.LEASE_EXPIRED) > kinds.index(EventType.CLAIMED)


def logged_for(caplog, run: Run) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if str(run.pk) in str(getattr(r, "distsched", {}).get("run_id", "")) and r.levelno >= logging.ERROR
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_a_success_that_cannot_be_recorded(scheduler, clock, monkeypatch, caplog, kind):
    first, second = two_runs(scheduler)
    failing_once(monkeypatch, outcomes, "record_successes", boom(kind))
    assert serve_both(scheduler) == 2  # the worker went on to the second run
    second.refresh_from_db()
    assert second.state == RunState.SUCCEEDED
    assert logged_for(caplog, first), "the failure is logged with the run id"
    assert EventType.RECORD_FAILED in history(first)  # the history says why it will run again
    assert_recovered_later(scheduler, clock, first, RunState.SUCCEEDED)


@pytest.mark.parametrize("kind", KINDS)
def test_a_failure_that_cannot_be_recorded(scheduler, clock, monkeypatch, caplog, kind):
    first, second = two_runs(scheduler, "tests.fail", message="planned")
    failing_once(monkeypatch, outcomes, "record_failure", boom(kind))
    assert serve_both(scheduler) == 2
    second.refresh_from_db()
    assert second.state == RunState.SUCCEEDED
    assert logged_for(caplog, first)
    assert EventType.RECORD_FAILED in history(first)
    assert_recovered_later(scheduler, clock, first, RunState.RETRYING)


@pytest.mark.parametrize("kind", ["database-error", "unicode", "bug"])
def test_an_event_insert_that_fails_inside_an_outcome_rolls_it_back_and_is_survived(
    scheduler, clock, monkeypatch, caplog, kind
):
    first, _second = two_runs(scheduler)
    real = events.record_many
    state = {"failed": False}

    def record_many(new, **kwargs):
        new = list(new)
        if not state["failed"] and any(e.event_type == EventType.SUCCEEDED for e in new):
            state["failed"] = True
            raise boom(kind)
        return real(new, **kwargs)

    monkeypatch.setattr(events, "record_many", record_many)
    assert serve_both(scheduler) == 2
    first.refresh_from_db()
    assert first.state == RunState.RUNNING and first.finished_at is None  # the outcome's transaction rolled back
    assert logged_for(caplog, first)
    assert_recovered_later(scheduler, clock, first, RunState.SUCCEEDED)


@pytest.mark.parametrize("kind", KINDS)
def test_a_lease_renewal_that_fails_is_logged_and_the_run_still_finishes(scheduler, monkeypatch, caplog, kind):
    scheduler.create_schedule(name="h", task_name="tests.hook", interval_seconds=3600, kwargs={"name": "beat"})
    scheduler.tick()
    worker = scheduler.worker(worker_id="w1", lease_seconds=LEASE, heartbeat_seconds=3600)
    failing_once(monkeypatch, outcomes, "renew_leases", boom(kind))
    test_tasks.HOOKS["beat"] = lambda context: worker.heartbeat()  # the heartbeat thread's body, mid-task
    execution = worker.run_once()
    assert execution.state == RunState.SUCCEEDED
    warnings = [r for r in caplog.records if r.getMessage() == "could not renew leases"]
    assert warnings and str(execution.run_id) in warnings[0].distsched["run_id"]


@pytest.mark.parametrize("kind", ["database-error", "unicode", "bug"])
def test_marking_a_prefetched_run_running_that_fails_is_survived(scheduler, monkeypatch, caplog, kind):
    for name in ("p1", "p2"):
        scheduler.create_schedule(name=name, task_name="tests.hook", interval_seconds=3600, kwargs={"name": "beat"})
    scheduler.tick()
    worker = scheduler.worker(worker_id="w1", lease_seconds=LEASE, heartbeat_seconds=3600, prefetch=2)
    worker.pace.observe(0.0)  # quick tasks: the second run is prefetched (leased, not yet running)
    failing_once(monkeypatch, outcomes, "mark_running", boom(kind))
    test_tasks.HOOKS["beat"] = lambda context: worker.heartbeat()
    assert worker.run(max_runs=2, burst=True, install_signals=False) == 2
    assert set(Run.objects.values_list("state", flat=True)) == {RunState.SUCCEEDED}
    for run in Run.objects.all():
        assert history(run).count(EventType.STARTED) == 1  # recorded with the success instead
    assert any(r.getMessage() == "could not mark run as running" for r in caplog.records)


@pytest.mark.parametrize("kind", ["database-error", "bug"])
def test_releasing_unstarted_runs_that_fails_leaves_them_to_lease_expiry(scheduler, clock, monkeypatch, kind):
    for name in ("r1", "r2", "r3"):
        scheduler.create_schedule(name=name, task_name="tests.hook", interval_seconds=3600, kwargs={"name": "stop"})
    scheduler.tick()
    worker = scheduler.worker(worker_id="w1", lease_seconds=LEASE, heartbeat_seconds=3600, prefetch=3)
    worker.pace.observe(0.0)
    failing_once(monkeypatch, outcomes, "release_runs", boom(kind))
    test_tasks.HOOKS["stop"] = lambda context: worker.request_stop()
    assert worker.run(burst=True, install_signals=False) == 1
    leased = Run.objects.filter(state=RunState.LEASED, lease_owner="w1")
    assert leased.count() == 2  # still ours until the lease expires
    clock.advance(seconds=LEASE + 1)
    w2 = scheduler.worker(worker_id="w2", lease_seconds=LEASE, heartbeat_seconds=3600)
    assert w2.run_once() is not None and w2.run_once() is not None  # each looks for expired leases
    assert Run.objects.filter(state=RunState.SUCCEEDED).count() == 3


def test_one_unrecordable_success_does_not_cost_the_rest_of_its_batch(scheduler, monkeypatch, caplog):
    for i in range(4):
        scheduler.create_schedule(name=f"s{i}", task_name="tests.noop", interval_seconds=3600)
    scheduler.tick()
    bad = Run.objects.get(schedule__name="s2")
    real = outcomes.record_successes

    def record_successes(*, worker_id, successes, now):
        if any(s.run_id == bad.pk for s in successes):
            raise DataError("this one cannot be stored")
        return real(worker_id=worker_id, successes=successes, now=now)

    monkeypatch.setattr(outcomes, "record_successes", record_successes)
    worker = scheduler.worker(worker_id="w1", lease_seconds=LEASE, heartbeat_seconds=3600, prefetch=4)
    worker.pace.observe(0.0)
    assert worker.run(burst=True, install_signals=False) == 4
    states = dict(Run.objects.values_list("schedule__name", "state"))
    assert states.pop("s2") == RunState.LEASED  # prefetched, executed, not recorded: still ours
    assert states == {"s0": "succeeded", "s1": "succeeded", "s3": "succeeded"}
    assert EventType.RECORD_FAILED in history(bad)
    assert logged_for(caplog, bad)


def test_when_even_the_note_cannot_be_written_the_worker_still_goes_on(scheduler, monkeypatch, caplog):
    first, second = two_runs(scheduler)
    failing_once(monkeypatch, outcomes, "record_successes", RuntimeError("bug"))
    monkeypatch.setattr(outcomes, "note_unrecorded", lambda **kwargs: (_ for _ in ()).throw(DatabaseError("down")))
    assert serve_both(scheduler) == 2
    second.refresh_from_db()
    assert second.state == RunState.SUCCEEDED
    assert EventType.RECORD_FAILED not in history(first)
    assert any("could not note" in r.getMessage() for r in caplog.records)


def test_the_lease_kept_by_an_unrecorded_run_expires_on_time(scheduler, clock, monkeypatch):
    first, _ = two_runs(scheduler)
    failing_once(monkeypatch, outcomes, "record_successes", RuntimeError("bug"))
    serve_both(scheduler)
    first.refresh_from_db()
    assert first.lease_expires_at == clock.now() + timedelta(seconds=LEASE)
