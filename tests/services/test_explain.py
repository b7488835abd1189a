"""``services.explain``: why a run is not running, one kind of reason at a time, each state made by
the real services (claims, overlap=replace, overrides, pauses) on a fake clock."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from distsched_app.clock import iso_utc
from distsched_app.models import Run, RunState
from distsched_app.services import claiming, limit_overrides, outcomes, queues, runs, workers
from distsched_app.services.enqueue import Job, enqueue
from distsched_app.services.explain import KINDS, explain
from tests.conftest import T0

pytestmark = pytest.mark.django_db


@pytest.fixture
def declare(settings):
    def apply(limits_: dict) -> None:
        settings.DISTSCHED = {**settings.DISTSCHED, "LIMITS": limits_}

    return apply


@pytest.fixture
def worker(clock):
    """A live worker serving every queue (so a claimable run is not also waiting for a worker)."""

    def register(worker_id: str = "w-live", queues_=(), capabilities=()):
        return workers.register_worker(
            worker_id=worker_id, hostname="h", pid=1, queues=queues_, capabilities=capabilities, now=clock.now()
        )

    return register


def add(task: str = "tests.echo", *, at=T0, queue: str = "default", run_after=None, **kwargs) -> Run:
    return enqueue(Job(task_name=task, kwargs=kwargs, queue=queue, run_after=run_after), now=at).run


def claim(clock, worker_id: str = "w1", *, limit: int = 1, start_all: bool = False, lease: float = 30) -> list[Run]:
    return claiming.claim_runs(
        worker_id=worker_id, queues=None, lease_seconds=lease, now=clock.now(), limit=limit, start_all=start_all
    )


def why(run: Run, clock) -> dict:
    answer = explain(Run.objects.get(pk=run.pk), now=clock.now())
    assert json.loads(json.dumps(answer)) == answer  # JSON-ready as it is
    assert all(r["kind"] in KINDS and r["message"] for r in answer["waiting_for"])
    return answer


def only(answer: dict) -> dict:
    [reason] = answer["waiting_for"]
    return reason


# -- claimable, finished ------------------------------------------------------------------------


def test_a_due_run_with_a_live_worker_is_claimable_and_waits_for_nothing(clock, worker):
    worker()
    run = add()
    assert why(run, clock) == {
        "run": run.pk,
        "state": "pending",
        "claimable": True,
        "waiting_for": [],
        "next_possible_start": iso_utc(T0),
    }


def test_a_claimable_run_no_live_worker_serves_says_so(clock, worker):
    worker("other", queues_=["emails"])
    run = add(queue="reports")
    answer = why(run, clock)
    assert answer["claimable"] is True and answer["next_possible_start"] is None
    assert only(answer) == {
        "kind": "no_worker",
        "queue": "reports",
        "message": "no live worker serves queue reports: the first one to start claims it",
    }


def test_a_finished_run_waits_for_nothing(clock, worker):
    run = add()
    claim(clock, start_all=True)
    outcomes.record_successes(
        worker_id="w1",
        successes=[outcomes.Success(run_id=run.pk, attempt=1, started_at=clock.now(), finished_at=clock.now())],
        now=clock.now(),
    )
    answer = why(run, clock)
    assert (answer["state"], answer["claimable"], answer["waiting_for"], answer["next_possible_start"]) == (
        "succeeded",
        False,
        [],
        None,
    )


# -- running, cancel requested ------------------------------------------------------------------------


def test_a_running_run_names_its_worker_and_lease_and_a_cancel_request(clock):
    run = add()
    claim(clock, "w-9", start_all=True, lease=30)
    answer = why(run, clock)
    assert answer["claimable"] is False and answer["next_possible_start"] is None
    assert only(answer) == {
        "kind": "running",
        "owner": "w-9",
        "lease_expires_at": "2026-03-02T09:00:30Z",
        "lease_expired": False,
        "message": "running on worker w-9, lease until 2026-03-02T09:00:30Z",
    }
    runs.cancel_run(run.pk, now=clock.now(), actor="ops")
    assert [r["kind"] for r in why(run, clock)["waiting_for"]] == ["running", "cancel_requested"]
    clock.advance(31)
    reason = why(run, clock)["waiting_for"][0]
    assert reason["lease_expired"] is True and "the next claim recovers it" in reason["message"]


def test_a_prefetched_run_is_leased(clock):
    add()
    second = add()
    claim(clock, "w-1", limit=2)  # one thread: the second is prefetched (leased)
    assert Run.objects.get(pk=second.pk).state == RunState.LEASED
    assert "leased by worker w-1 (prefetched" in only(why(second, clock))["message"]


# -- not due ---------------------------------------------------------------------------------------------


def test_a_run_scheduled_for_later_is_not_due_until_then(clock, worker):
    worker()
    later = T0 + timedelta(hours=1)
    run = add(run_after=later)
    answer = why(run, clock)
    assert answer["claimable"] is False and answer["next_possible_start"] == iso_utc(later)
    assert only(answer) == {
        "kind": "not_due",
        "at": iso_utc(later),
        "retry": False,
        "message": f"not due yet: scheduled for {iso_utc(later)}",
    }


def test_a_retrying_run_waits_for_its_backoff(clock, worker, make_schedule, scheduler):
    worker()
    make_schedule("f", task_name="tests.fail", max_attempts=3)
    [run] = scheduler.tick()
    claim(clock, start_all=True)
    outcomes.record_failure(run_id=run.pk, worker_id="w1", attempt=1, now=clock.now(), error="boom")
    run.refresh_from_db()
    assert run.state == RunState.RETRYING and run.available_at > clock.now()
    reason = only(why(run, clock))
    assert (reason["kind"], reason["retry"]) == ("not_due", True)
    assert reason["message"] == f"retry backoff: attempt 2 of 3 not before {iso_utc(run.available_at)}"
    assert why(run, clock)["next_possible_start"] == iso_utc(run.available_at)


# -- queue paused, capabilities ----------------------------------------------------------------------------


def test_a_run_of_a_paused_queue_names_the_pause(clock, worker):
    worker()
    run = add(queue="reports")
    queues.pause_queue("reports", now=clock.now(), by="user:alice", reason="vendor outage")
    answer = why(run, clock)
    assert answer["claimable"] is False and answer["next_possible_start"] is None
    assert only(answer) == {
        "kind": "queue_paused",
        "queue": "reports",
        "by": "user:alice",
        "since": iso_utc(T0),
        "reason": "vendor outage",
        "message": "queue reports is paused by user:alice since 2026-03-02T09:00:00Z (vendor outage): "
        "its waiting runs are not claimed until it is resumed",
    }


def test_a_run_no_live_worker_has_the_capabilities_for(clock, worker, settings):
    settings.DISTSCHED = {**settings.DISTSCHED, "TASK_REQUIRES": {"tests.echo": ["gpu"]}}
    worker("cpu-only")
    run = add()
    answer = why(run, clock)
    assert answer["claimable"] is False and answer["next_possible_start"] is None
    reason = only(answer)
    assert (reason["kind"], reason["capabilities"]) == ("capabilities", ["gpu"])
    worker("gpu-box", capabilities=["gpu"])
    assert why(run, clock)["waiting_for"] == [] and why(run, clock)["claimable"] is True


# -- limits -------------------------------------------------------------------------------------------------


def test_a_run_blocked_on_a_full_concurrency_limit_names_the_holders(declare, clock):
    declare({"one": {"task": "tests.echo", "concurrency": 1}})
    a, b = add(), add(at=T0 + timedelta(seconds=1))
    clock.advance(2)
    claim(clock)
    claim(clock, "w2")  # b: blocked
    answer = why(b, clock)
    assert (answer["state"], answer["claimable"], answer["next_possible_start"]) == ("blocked", False, None)
    assert only(answer) == {
        "kind": "concurrency",
        "limit": "one",
        "partition": "",
        "in_use": 1,
        "capacity": 1,
        "holders": [a.pk],
        "since": "2026-03-02T09:00:02Z",
        "message": f"limit one is full: 1/1 running (run(s) {a.pk}); blocked since 2026-03-02T09:00:02Z, "
        "until one of them ends",
    }


def test_the_capacity_is_the_effective_one_per_partition_and_with_an_override(declare, clock):
    declare(
        {
            "acct": {
                "task": "tests.echo",
                "concurrency": 1,
                "partition_by": ["account"],
                "per_partition": {"big": {"concurrency": 2}},
            }
        }
    )
    big = [add(account="big", at=T0 + timedelta(seconds=i)) for i in range(3)]
    clock.advance(5)
    claim(clock, limit=3, start_all=True)
    reason = only(why(big[2], clock))
    assert (reason["partition"], reason["in_use"], reason["capacity"]) == ("big", 2, 2)
    assert reason["holders"] == [big[0].pk, big[1].pk]
    assert reason["message"].startswith("limit acct (partition 'big') is full: 2/2 running")
    limit_overrides.set_override("acct", {"concurrency": 1}, now=clock.now(), by="user:ops")
    reason = only(why(big[2], clock))
    assert (reason["in_use"], reason["capacity"]) == (2, 1)


def test_a_run_blocked_on_the_whole_limit_says_total(declare, clock):
    declare({"gpu": {"task": "tests.echo", "total": 1, "partition_by": ["tenant"]}})
    a, b = add(tenant="x"), add(tenant="y", at=T0 + timedelta(seconds=1))
    clock.advance(2)
    claim(clock, limit=2, start_all=True)
    reason = only(why(b, clock))
    assert (reason["kind"], reason["partition"], reason["in_use"], reason["capacity"], reason["holders"]) == (
        "total",
        "y",
        1,
        1,
        [a.pk],
    )
    assert reason["message"].startswith(f"limit gpu is full in all partitions: 1/1 running (run(s) {a.pk})")


def test_a_run_blocked_by_a_paused_limit_names_who_paused_it(declare, clock):
    declare({"one": {"task": "tests.echo", "concurrency": 5}})
    run = add()
    limit_overrides.set_override(
        "one", {"paused": True}, now=clock.now(), by="user:ops", reason="db migration", for_seconds=600
    )
    clock.advance(1)
    assert claim(clock) == []
    reason = only(why(run, clock))
    assert reason == {
        "kind": "paused_limit",
        "limit": "one",
        "partition": "",
        "by": "user:ops",
        "reason": "db migration",
        "until": "2026-03-02T09:10:00Z",
        "since": "2026-03-02T09:00:01Z",
        "message": "limit one is paused by user:ops (db migration) until 2026-03-02T09:10:00Z",
    }


def test_a_blocked_run_whose_holders_lease_expired_says_a_slot_is_free(declare, clock):
    declare({"one": {"task": "tests.echo", "concurrency": 1}})
    add()
    b = add(at=T0 + timedelta(seconds=1))
    clock.advance(2)
    claim(clock, lease=5)
    claim(clock, "w2")
    clock.advance(6)  # a's worker died: its slot is free, nothing has let b through yet
    reason = only(why(b, clock))
    assert (reason["kind"], reason["in_use"], reason["holders"]) == ("concurrency", 0, [])
    assert "a slot is free now (0/1 running): the next release or sweep lets it through" in reason["message"]


def test_a_run_blocked_by_a_limit_no_longer_declared(declare, clock):
    declare({"one": {"task": "tests.echo", "concurrency": 1}})
    add(), add()
    claim(clock)
    claim(clock, "w2")
    [b] = Run.objects.filter(state=RunState.BLOCKED)
    declare({})
    reason = only(why(b, clock))
    assert reason["kind"] == "blocked" and "no longer declared" in reason["message"]


def test_a_rate_throttled_run_says_when_it_starts_next(declare, clock, worker):
    declare({"r": {"task": "tests.echo", "rate": "2/s"}})
    first, second = add(), add()
    worker()
    [got] = claim(clock, limit=2, start_all=True)
    waiting = second if got.pk == first.pk else first
    at = Run.objects.get(pk=waiting.pk).available_at
    assert at == T0 + timedelta(seconds=0.5)
    answer = why(waiting, clock)
    assert (answer["state"], answer["claimable"], answer["next_possible_start"]) == ("pending", False, iso_utc(at))
    assert only(answer) == {
        "kind": "rate",
        "limit": "r",
        "partition": "",
        "rate": "2/s",
        "next_start": iso_utc(at),
        "message": f"rate 2/s of limit r: next start at {iso_utc(at)}",
    }
    clock.advance(0.5)
    assert why(waiting, clock)["claimable"] is True and why(waiting, clock)["waiting_for"] == []


# -- overlap=replace ----------------------------------------------------------------------------------------


def test_a_replacement_names_the_run_it_waits_for_and_its_state(clock, make_schedule, scheduler):
    make_schedule("r", interval_seconds=60, overlap="replace")
    [first] = scheduler.tick()
    claiming.claim_next_run(worker_id="A", queues=None, lease_seconds=300, now=clock.now())
    clock.advance(seconds=60)
    [second] = scheduler.tick()
    answer = why(second, clock)
    assert (answer["state"], answer["claimable"], answer["next_possible_start"]) == ("blocked", False, None)
    reason = only(answer)
    assert (reason["kind"], reason["replaces"], reason["replaces_state"]) == ("replaces", first.pk, "running")
    assert reason["since"] == "2026-03-02T09:01:00Z"
    assert f"waiting for run {first.pk} it replaces (overlap=replace), running and asked to stop" in reason["message"]
    assert [r["kind"] for r in why(first, clock)["waiting_for"]] == ["running", "cancel_requested"]
    clock.advance(seconds=300)  # the old run's lease expired
    assert "the next sweep lets this run through" in only(why(second, clock))["message"]


# -- queries ------------------------------------------------------------------------------------------------


def test_few_queries_and_none_about_limits_when_none_are_declared(clock, worker, django_assert_num_queries):
    worker()
    run = Run.objects.get(pk=add().pk)
    with django_assert_num_queries(2):  # the queue's pause, the live workers
        explain(run, now=clock.now())


def test_a_blocked_run_costs_a_handful_of_queries(declare, clock, django_assert_num_queries):
    declare({"gpu": {"task": "tests.echo", "total": 1, "concurrency": 1, "partition_by": ["tenant"]}})
    add(tenant="x"), add(tenant="y")
    claim(clock, limit=2, start_all=True)
    [blocked] = Run.objects.filter(state=RunState.BLOCKED)
    with django_assert_num_queries(5):  # pause, since, override row, partition holders, limit holders
        explain(blocked, now=clock.now())
