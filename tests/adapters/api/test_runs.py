"""REST API: /api/runs (list, filters, cursor pagination, detail, events, cancel, requeue)."""

from __future__ import annotations

import base64
from datetime import timedelta

import pytest

from distsched_app.models import Origin, Run, RunState
from distsched_app.services import claiming, outcomes
from tests.conftest import T0
from tests.factories import succeed

pytestmark = pytest.mark.django_db

RUN_KEYS = {
    "id",
    "schedule",
    "schedule_version",
    "task_name",
    "args",
    "kwargs",
    "state",
    "scheduled_for",
    "available_at",
    "attempts",
    "max_attempts",
    "lease_owner",
    "lease_expires_at",
    "started_at",
    "finished_at",
    "last_error",
    "result",
    "queue",
    "priority",
    "origin",
    "idempotency_key",
    "unique_key",
    "retry_policy",
    "cancel_requested",
    "fencing_token",
    "created_at",
    "updated_at",
}


def iso(dt) -> str:
    return dt.isoformat().replace("+00:00", "Z")


@pytest.fixture
def make_runs(make_schedule):
    """``make_runs(n)``: n generated runs spread over three schedules, oldest first."""
    schedules = [make_schedule(f"s{i}", queue=f"q{i}") for i in range(3)]

    def make(n: int) -> list[Run]:
        runs = []
        for k in range(n):
            schedule = schedules[k % 3]
            slot = T0 + timedelta(minutes=k)
            runs.append(
                Run(
                    schedule=schedule,
                    task_name=schedule.task_name,
                    scheduled_for=slot,
                    available_at=slot,
                    queue=schedule.queue,
                    idempotency_key=f"{schedule.name}:{slot.isoformat()}",
                    created_at=slot,
                    updated_at=slot,
                )
            )
        Run.objects.bulk_create(runs)
        return list(Run.objects.order_by("id"))

    return make


def claim(clock, worker="w1"):
    return claiming.claim_next_run(worker_id=worker, queues=None, lease_seconds=30, now=clock.now())


# --------------------------------------------------------------------------
# list


@pytest.mark.parametrize("url", ["/api/runs", "/api/runs/"])
def test_list_is_newest_first_with_every_field(api, make_runs, url):
    runs = make_runs(4)
    response = api.get(url)
    assert response.status_code == 200
    results = response.json()["results"]
    assert [r["id"] for r in results] == [r.pk for r in reversed(runs)]
    assert set(results[0]) == RUN_KEYS
    assert results[-1]["schedule"] == "s0" and results[-1]["queue"] == "q0"


def test_filters(api, api_clock, scheduler, make_schedule):
    make_schedule("a", task_name="tests.echo", queue="fast")
    make_schedule("b", task_name="tests.noop")
    scheduler.tick()
    manual = scheduler.trigger("b")
    scheduler.cancel_run(manual.pk)

    def ids(query: str) -> list[int]:
        response = api.get(f"/api/runs?{query}")
        assert response.status_code == 200, response.json()
        return [r["id"] for r in response.json()["results"]]

    run_a = Run.objects.get(schedule__name="a")
    run_b = Run.objects.get(schedule__name="b", origin=Origin.SCHEDULE)
    assert ids("schedule=a") == [run_a.pk]
    assert ids("schedule=b") == [manual.pk, run_b.pk]
    assert ids("schedule=nope") == []
    assert ids("state=cancelled") == [manual.pk]
    assert ids("state=pending") == [run_b.pk, run_a.pk]
    assert ids("task_name=tests.echo") == [run_a.pk]
    assert ids("queue=fast") == [run_a.pk]
    assert ids("schedule=b&state=pending") == [run_b.pk]


@pytest.mark.parametrize("query", ["state=finished", "state=", "page_size=0", "page_size=501", "page_size=-1"])
def test_invalid_list_parameters_are_400(api, query):
    response = api.get(f"/api/runs?{query}")
    assert response.status_code == 400
    assert query.split("=")[0] in response.json()


def test_cursor_pagination_walks_forward_and_back(api, make_runs):
    runs = make_runs(7)
    expected = [r.pk for r in reversed(runs)]
    first = api.get("/api/runs?page_size=3").json()
    assert first["previous"] is None
    assert [r["id"] for r in first["results"]] == expected[:3]
    second = api.get(first["next"]).json()
    assert [r["id"] for r in second["results"]] == expected[3:6]
    third = api.get(second["next"]).json()
    assert [r["id"] for r in third["results"]] == expected[6:]
    assert third["next"] is None
    back = api.get(third["previous"]).json()
    assert [r["id"] for r in back["results"]] == expected[3:6]


def test_cursor_keeps_filters(api, make_runs):
    make_runs(9)
    page = api.get("/api/runs?schedule=s1&page_size=2").json()
    assert "schedule=s1" in page["next"]
    rest = api.get(page["next"]).json()["results"]
    assert {r["schedule"] for r in page["results"] + rest} == {"s1"}
    assert len(page["results"] + rest) == 3


def test_a_new_run_does_not_shift_the_next_page(api, make_runs, scheduler):
    runs = make_runs(4)
    page = api.get("/api/runs?page_size=2").json()
    scheduler.trigger("s0")  # newer than everything listed
    assert [r["id"] for r in api.get(page["next"]).json()["results"]] == [runs[1].pk, runs[0].pk]


@pytest.mark.parametrize("cursor", ["garbage", *(base64.b64encode(p).decode() for p in (b"p=abc", b"p=1\x00"))])
def test_invalid_cursor_is_404(api, make_runs, cursor):
    make_runs(2)
    response = api.get("/api/runs", {"cursor": cursor})
    assert response.status_code == 404
    assert response.json() == {"detail": "Invalid cursor"}


@pytest.mark.parametrize(("query", "total", "count"), [("", 50, 4), ("?state=pending", 50, 4), ("?schedule=s1", 17, 5)])
def test_list_costs_the_same_queries_for_5_and_50_rows(api, make_runs, django_assert_num_queries, query, total, count):
    make_runs(50)
    # One query authenticates the token, two read the user's permissions (own and groups'),
    # one reads the page (schedule names joined in); ?schedule= first resolves the name to an id.
    with django_assert_num_queries(count):
        small = api.get(f"/api/runs{query}{'&' if query else '?'}page_size=5")
    with django_assert_num_queries(count):
        large = api.get(f"/api/runs{query}{'&' if query else '?'}page_size=50")
    assert small.status_code == large.status_code == 200
    assert len(small.json()["results"]) == 5
    assert len(large.json()["results"]) == total


# --------------------------------------------------------------------------
# detail and events


def test_detail_of_a_blocked_run_names_the_run_it_replaces(api, api_clock, scheduler, make_schedule):
    make_schedule("s1", overlap="replace")
    [first] = scheduler.tick()
    claiming.claim_next_run(worker_id="w1", queues=None, lease_seconds=300, now=api_clock.now())
    api_clock.advance(seconds=60)
    [second] = scheduler.tick()
    body = api.get(f"/api/runs/{second.pk}").json()
    assert (body["state"], body["held_by"]) == ("blocked", f"run:{first.pk}")
    assert "held_by" not in api.get("/api/runs").json()["results"][0]  # detail only
    events = api.get(f"/api/runs/{first.pk}/events").json()
    events = events["results"] if isinstance(events, dict) else events
    assert [e["event_type"] for e in events][-2:] == ["replaced", "cancel_requested"]
    response = api.post(f"/api/runs/{second.pk}/cancel")
    assert response.status_code == 200 and response.json()["state"] == "cancelled"


def test_detail_of_a_running_run(api, api_clock, scheduler, make_schedule):
    make_schedule("s1", task_name="tests.echo", args=[1], max_attempts=4)
    [run] = scheduler.tick()
    api_clock.advance(seconds=2)
    claim(api_clock)
    response = api.get(f"/api/runs/{run.pk}/")
    assert response.status_code == 200
    body = response.json()
    assert set(body) == RUN_KEYS | {"held_by", "queue_pause", "waiting_for_capabilities"}  # detail-only fields
    assert body["held_by"] == ""
    assert body["queue_pause"] is None
    assert body["waiting_for_capabilities"] == []
    assert body["schedule"] == "s1" and body["state"] == RunState.RUNNING
    assert (body["attempts"], body["max_attempts"], body["lease_owner"]) == (1, 4, "w1")
    assert body["lease_expires_at"] == iso(T0 + timedelta(seconds=32))
    assert body["started_at"] == iso(T0 + timedelta(seconds=2))
    assert body["fencing_token"] == f"{run.pk}:1"
    assert body["idempotency_key"] == f"s1:{T0.isoformat()}"
    assert body["origin"] == "schedule" and body["cancel_requested"] is False
    assert (body["priority"], body["unique_key"], body["retry_policy"]) == (0, "", None)  # the schedule's policy


def test_detail_of_a_finished_run_has_result_and_error(api, api_clock, scheduler, make_schedule):
    make_schedule("ok")
    make_schedule("bad", max_attempts=1)
    scheduler.tick()
    first = claim(api_clock)
    succeed(first.pk, worker_id="w1", attempt=1, now=api_clock.now(), result={"n": 3})
    second = claim(api_clock)
    outcomes.record_failure(
        run_id=second.pk, worker_id="w1", attempt=1, now=api_clock.now(), error="boom", traceback_text="Traceback ..."
    )
    assert api.get(f"/api/runs/{first.pk}").json()["result"] == {"n": 3}
    dead = api.get(f"/api/runs/{second.pk}").json()
    assert dead["state"] == "dead" and dead["last_error"].startswith("boom")


@pytest.mark.parametrize("run_id", ["999999", "abc", "-1", "0", "1.5", "%00", "99999999999999999999999", "１"])  # noqa: RUF001
def test_unknown_or_malformed_run_id_is_404(api, run_id):
    for method, suffix in [
        ("get", ""),
        ("get", "/events"),
        ("get", "/explain"),
        ("post", "/cancel"),
        ("post", "/requeue"),
    ]:
        response = getattr(api, method)(f"/api/runs/{run_id}{suffix}")
        assert response.status_code == 404, (method, suffix)
        assert "detail" in response.json()


def test_events_are_in_order_and_paginated(api, api_clock, scheduler, make_schedule):
    make_schedule("s1", max_attempts=2)
    [run] = scheduler.tick()
    claim(api_clock)
    outcomes.record_failure(run_id=run.pk, worker_id="w1", attempt=1, now=api_clock.now(), error="boom")
    response = api.get(f"/api/runs/{run.pk}/events/")
    assert response.status_code == 200
    events = response.json()["results"]
    assert [e["event_type"] for e in events] == ["created", "claimed", "started", "failed", "retry_scheduled"]
    assert set(events[0]) == {"id", "run", "event_type", "message", "worker_id", "attempt", "created_at"}
    assert events[1]["run"] == run.pk and events[1]["worker_id"] == "w1" and events[1]["attempt"] == 1
    page = api.get(f"/api/runs/{run.pk}/events?page_size=2").json()
    walked = page["results"]
    while page["next"]:
        page = api.get(page["next"]).json()
        walked += page["results"]
    assert walked == events


def test_events_ignore_run_filters(api, scheduler, make_schedule):
    make_schedule("s1")
    [run] = scheduler.tick()
    assert len(api.get(f"/api/runs/{run.pk}/events?state=dead").json()["results"]) == 1


# --------------------------------------------------------------------------
# cancel and requeue


def test_cancel_a_pending_run(api, api_clock, scheduler, make_schedule):
    make_schedule("s1")
    [run] = scheduler.tick()
    api_clock.advance(seconds=9)
    response = api.post(f"/api/runs/{run.pk}/cancel")
    assert response.status_code == 200
    body = response.json()
    assert body["state"] == "cancelled" and body["finished_at"] == iso(T0 + timedelta(seconds=9))
    assert body["schedule"] == "s1"
    events = api.get(f"/api/runs/{run.pk}/events").json()["results"]
    assert (events[-1]["event_type"], events[-1]["message"]) == ("cancelled", "cancelled by user:operator")


def test_cancel_a_running_run_is_cooperative(api, api_clock, scheduler, make_schedule):
    make_schedule("s1")
    [run] = scheduler.tick()
    claim(api_clock)
    response = api.post(f"/api/runs/{run.pk}/cancel/")
    assert response.status_code == 200
    assert (response.json()["state"], response.json()["cancel_requested"]) == ("running", True)
    assert Run.objects.get().cancel_requested


def test_cancel_a_succeeded_run_is_a_conflict(api, api_clock, scheduler, make_schedule):
    make_schedule("s1")
    [run] = scheduler.tick()
    claim(api_clock)
    succeed(run.pk, worker_id="w1", attempt=1, now=api_clock.now())
    response = api.post(f"/api/runs/{run.pk}/cancel")
    assert response.status_code == 409
    assert "succeeded" in response.json()["detail"]
    assert Run.objects.get().state == RunState.SUCCEEDED


def test_requeue_a_pending_run_is_a_conflict(api, scheduler, make_schedule):
    make_schedule("s1")
    [run] = scheduler.tick()
    response = api.post(f"/api/runs/{run.pk}/requeue")
    assert response.status_code == 409
    assert "pending" in response.json()["detail"]


def test_requeue_a_dead_run(api, api_clock, scheduler, make_schedule):
    make_schedule("s1", max_attempts=1)
    [run] = scheduler.tick()
    claim(api_clock)
    outcomes.record_failure(run_id=run.pk, worker_id="w1", attempt=1, now=api_clock.now(), error="boom")
    api_clock.advance(minutes=1)
    response = api.post(f"/api/runs/{run.pk}/requeue/")
    assert response.status_code == 200
    body = response.json()
    assert (body["state"], body["attempts"], body["max_attempts"]) == ("pending", 1, 2)
    assert body["available_at"] == iso(T0 + timedelta(minutes=1)) and body["finished_at"] is None
    assert body["scheduled_for"] == iso(T0)
    assert api.get(f"/api/runs/{run.pk}/events").json()["results"][-1]["event_type"] == "requeued"


def test_requeue_a_run_whose_unique_key_is_taken_is_a_conflict(api):
    first = api.post("/api/runs", {"task_name": "tests.noop", "unique_key": "nightly"}).json()["id"]
    assert api.post(f"/api/runs/{first}/cancel").status_code == 200
    second = api.post("/api/runs", {"task_name": "tests.noop", "unique_key": "nightly"}).json()["id"]
    response = api.post(f"/api/runs/{first}/requeue")
    assert response.status_code == 409
    assert response.json() == {
        "detail": f"run {first} cannot be requeued: unfinished run {second} of task tests.noop "
        "holds its unique key 'nightly'"
    }
    assert Run.objects.get(pk=first).state == RunState.CANCELLED
    assert Run.objects.get(pk=second).state == RunState.PENDING
