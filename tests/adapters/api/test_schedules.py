"""REST API: /api/schedules and its actions (pause, resume, trigger)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from distsched_app.errors import ValidationError
from distsched_app.models import Origin, RunState, Schedule
from tests.conftest import T0

pytestmark = pytest.mark.django_db

SCHEDULE_KEYS = {
    "name",
    "version",
    "declared",
    "task_name",
    "args",
    "kwargs",
    "kind",
    "interval_seconds",
    "cron",
    "timezone",
    "run_at",
    "start_at",
    "next_run_at",
    "paused",
    "max_attempts",
    "retry_base_seconds",
    "retry_max_seconds",
    "retry_jitter",
    "catch_up",
    "overlap",
    "queue",
    "created_at",
    "updated_at",
}


def iso(dt) -> str:
    return dt.isoformat().replace("+00:00", "Z")


def create(api, **body):
    body = {"name": "s1", "task_name": "tests.noop", **body}
    if not {"interval_seconds", "cron", "run_at"} & set(body):
        body["interval_seconds"] = 60
    return api.post("/api/schedules", body)


# --------------------------------------------------------------------------
# create


def test_create_interval_schedule(api, api_clock):
    api_clock.advance(seconds=30)
    response = create(
        api,
        name="billing",
        task_name="tests.echo",
        kwargs={"account": 42},
        args=[1, "a"],
        interval_seconds=60,
        max_attempts=5,
        queue="slow",
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert set(body) == SCHEDULE_KEYS | {"upcoming", "last_run"}
    now = T0 + timedelta(seconds=30)
    assert body["name"] == "billing" and body["kind"] == "interval" and body["interval_seconds"] == 60
    assert body["args"] == [1, "a"] and body["kwargs"] == {"account": 42}
    assert (body["max_attempts"], body["queue"], body["paused"]) == (5, "slow", False)
    assert body["created_at"] == body["updated_at"] == body["next_run_at"] == iso(now)
    assert body["upcoming"] == [iso(now + timedelta(seconds=60 * k)) for k in range(5)]
    assert body["last_run"] is None
    assert Schedule.objects.get(name="billing").task_name == "tests.echo"


def test_create_cron_schedule_in_a_time_zone(api):
    response = create(api, name="nightly", cron="0 3 * * *", timezone="Europe/Paris", catch_up="skip", overlap="skip")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["kind"], body["cron"], body["timezone"]) == ("cron", "0 3 * * *", "Europe/Paris")
    # 03:00 in Paris is 02:00 UTC in March (CET, before the switch to summer time on the 29th).
    assert body["upcoming"] == [f"2026-03-0{d}T02:00:00Z" for d in (3, 4, 5, 6, 7)]
    assert (body["catch_up"], body["overlap"]) == ("skip", "skip")


def test_create_and_patch_overlap_replace(api, api_clock):
    response = create(api, overlap="replace")
    assert response.status_code == 201, response.json()
    assert response.json()["overlap"] == "replace"
    assert Schedule.objects.get(name="s1").overlap == "replace"
    response = api.patch("/api/schedules/s1", {"overlap": "skip"})
    assert response.status_code == 200, response.json()
    assert api.patch("/api/schedules/s1", {"overlap": "replace"}).json()["overlap"] == "replace"
    response = api.patch("/api/schedules/s1", {"overlap": "never"})
    assert response.status_code == 400 and "overlap" in response.json()


def test_create_once_schedule(api):
    response = create(api, name="once", run_at="2026-03-05T12:00:00+01:00")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["kind"] == "once"
    assert body["run_at"] == body["next_run_at"] == "2026-03-05T11:00:00Z"
    assert body["upcoming"] == ["2026-03-05T11:00:00Z"]


@pytest.mark.parametrize("url", ["/api/schedules", "/api/schedules/"])
def test_create_with_and_without_trailing_slash(api, url):
    response = api.post(url, {"name": "s", "task_name": "tests.noop", "interval_seconds": 5})
    assert response.status_code == 201


def test_duplicate_name_is_a_field_error(api):
    assert create(api, name="dup").status_code == 201
    response = create(api, name="dup")
    assert response.status_code == 400
    assert list(response.json()) == ["name"]
    assert "already exists" in response.json()["name"][0]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"interval_seconds": 0}, "interval_seconds"),
        ({"interval_seconds": -5}, "interval_seconds"),
        ({"interval_seconds": 1.5}, "interval_seconds"),
        ({"interval_seconds": "60"}, "interval_seconds"),
        ({"interval_seconds": 10**30}, "interval_seconds"),
        ({"task_name": "no.such.task"}, "task_name"),
        ({"task_name": 5}, "task_name"),
        ({"task_name": None}, "task_name"),
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "not a cron"}, "cron"),
        ({"cron": "0 3 * * *", "timezone": "Mars/Olympus_Mons"}, "timezone"),
        ({"run_at": "2020-01-01T00:00:00Z"}, "run_at"),
        ({"run_at": "2026-03-05T12:00:00"}, "run_at"),
        ({"run_at": "yesterday"}, "run_at"),
        ({"run_at": "9999-12-31T23:00:00Z"}, "run_at"),
        ({"kwargs": [1, 2]}, "kwargs"),
        ({"kwargs": "x=1"}, "kwargs"),
        ({"kwargs": None}, "kwargs"),
        ({"kwargs": {"k": "nul\x00"}}, "kwargs"),
        ({"args": {"a": 1}}, "args"),
        ({"args": "[1]"}, "args"),
        ({"paused": "yes"}, "paused"),
        ({"paused": 1}, "paused"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": 10**30}, "max_attempts"),
        ({"retry_base_seconds": 100, "retry_max_seconds": 10}, "retry_max_seconds"),
        ({"retry_jitter": 2}, "retry_jitter"),
        ({"catch_up": "some"}, "catch_up"),
        ({"queue": "has space"}, "queue"),
        ({"name": "has space"}, "name"),
        ({"name": ""}, "name"),
        ({"name": None}, "name"),
        ({"name": "x" * 101}, "name"),
        ({"interval_seconds": 60, "cron": "* * * * *"}, "kind"),
        ({"kind": "cron", "interval_seconds": 60}, "kind"),
        ({"start_at": "2026-03-05T12:00:00Z", "run_at": "2026-03-05T12:00:00Z"}, "start_at"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(api, body, field):
    response = create(api, **body)
    assert response.status_code == 400, response.json()
    errors = response.json()
    assert field in errors, errors
    assert all(isinstance(message, str) for message in errors[field])
    assert not Schedule.objects.exists()


def test_missing_required_fields(api):
    response = api.post("/api/schedules", {})
    assert response.status_code == 400
    assert set(response.json()) == {"name", "task_name"}


def test_a_body_that_is_not_an_object_is_a_non_field_error(api):
    response = api.post("/api/schedules", [1, 2])
    assert response.status_code == 400
    assert "non_field_errors" in response.json()


# --------------------------------------------------------------------------
# list


def test_list_is_alphabetical_and_paginated_by_cursor(api, make_schedule):
    for name in ["delta", "alpha", "echo", "charlie", "bravo"]:
        make_schedule(name)
    seen, url, pages = [], "/api/schedules?page_size=2", 0
    while url:
        response = api.get(url)
        assert response.status_code == 200
        body = response.json()
        assert set(body) == {"next", "previous", "results"}
        seen += [s["name"] for s in body["results"]]
        url, pages = body["next"], pages + 1
    assert seen == ["alpha", "bravo", "charlie", "delta", "echo"]
    assert pages == 3
    assert set(api.get("/api/schedules").json()["results"][0]) == SCHEDULE_KEYS


def test_list_filters(api, scheduler, make_schedule):
    make_schedule("a", task_name="tests.echo", queue="q1")
    make_schedule("b", cron="0 * * * *")
    make_schedule("c", run_at=T0 + timedelta(days=1))
    scheduler.pause("c")

    def names(query: str) -> list[str]:
        response = api.get(f"/api/schedules/?{query}")
        assert response.status_code == 200, response.json()
        return [s["name"] for s in response.json()["results"]]

    assert names("paused=true") == ["c"]
    assert names("paused=false") == ["a", "b"]
    assert names("kind=cron") == ["b"]
    assert names("task_name=tests.echo") == ["a"]
    assert names("queue=q1") == ["a"]
    assert names("queue=nowhere") == []


@pytest.mark.parametrize("query", ["paused=maybe", "paused=", "kind=weekly", "page_size=0", "page_size=x"])
def test_invalid_list_parameters_are_400(api, query):
    response = api.get(f"/api/schedules?{query}")
    assert response.status_code == 400
    assert query.split("=")[0] in response.json()


# --------------------------------------------------------------------------
# detail, update, delete


@pytest.mark.parametrize("url", ["/api/schedules/s1", "/api/schedules/s1/"])
def test_detail_shows_upcoming_and_last_run(api, api_clock, scheduler, make_schedule, url):
    make_schedule("s1", interval_seconds=3600)
    body = api.get(url).json()
    assert body["last_run"] is None
    [run] = scheduler.tick()
    api_clock.advance(minutes=5)
    body = api.get(url).json()
    assert body["next_run_at"] == iso(T0 + timedelta(hours=1))
    assert body["upcoming"] == [iso(T0 + timedelta(hours=h)) for h in range(1, 6)]
    assert body["last_run"] == {"id": run.pk, "state": "pending", "scheduled_for": iso(T0), "finished_at": None}
    triggered = scheduler.trigger("s1")
    scheduler.cancel_run(triggered.pk)
    assert api.get(url).json()["last_run"] == {
        "id": triggered.pk,
        "state": "cancelled",
        "scheduled_for": iso(T0 + timedelta(minutes=5)),
        "finished_at": iso(T0 + timedelta(minutes=5)),
    }


def test_paused_once_schedule_that_has_fired_has_no_upcoming(api, api_clock, scheduler, make_schedule):
    make_schedule("once", run_at=T0 + timedelta(minutes=1))
    api_clock.advance(minutes=2)
    scheduler.tick()
    body = api.get("/api/schedules/once").json()
    assert body["next_run_at"] is None and body["upcoming"] == []


@pytest.mark.parametrize("stored", [{"cron": "0 R * * *"}, {"cron": "0 0 * * 5#3"}, {"timezone": "Mars/Olympus"}])
def test_detail_of_a_stored_recurrence_that_no_longer_validates_has_no_upcoming(api, make_schedule, stored):
    # Written before the strict cron dialect, or by SQL: the detail still loads (no 500).
    make_schedule("old", cron="0 3 * * *")
    Schedule.objects.filter(name="old").update(**stored)
    response = api.get("/api/schedules/old")
    assert response.status_code == 200
    body = response.json()
    assert body["upcoming"] == []
    assert {key: body[key] for key in stored} == stored
    assert body["next_run_at"] is not None


def test_dates_near_the_end_of_time_are_refused(api, make_schedule):
    # The service itself refuses them (recurrence arithmetic would overflow year 9999).
    with pytest.raises(ValidationError):
        make_schedule("far", interval_seconds=3600, start_at=datetime(9999, 12, 31, 21, tzinfo=timezone.utc))
    response = api.post(
        "/api/schedules",
        {"name": "far", "task_name": "tests.noop", "interval_seconds": 60, "start_at": "9999-12-31T21:00:00Z"},
    )
    assert response.status_code == 400 and "start_at" in response.json()


@pytest.mark.parametrize("name", ["nope", "%00", "a%20b", "x" * 300])
def test_unknown_schedule_is_404_everywhere(api, name):
    for method, suffix in [
        ("get", ""),
        ("patch", ""),
        ("delete", ""),
        ("post", "/pause"),
        ("post", "/resume"),
        ("post", "/trigger"),
    ]:
        response = getattr(api, method)(f"/api/schedules/{name}{suffix}")
        assert response.status_code == 404, (method, suffix, response.content)
        assert "detail" in response.json()


def test_patch_changes_fields_and_restarts_the_recurrence(api, api_clock, make_schedule):
    make_schedule("s1", interval_seconds=60)
    api_clock.advance(minutes=10)
    response = api.patch("/api/schedules/s1/", {"interval_seconds": 300, "max_attempts": 7, "kwargs": {"a": 1}})
    assert response.status_code == 200, response.json()
    body = response.json()
    now = T0 + timedelta(minutes=10)
    assert (body["interval_seconds"], body["max_attempts"], body["kwargs"]) == (300, 7, {"a": 1})
    assert body["next_run_at"] == body["updated_at"] == iso(now)
    assert body["upcoming"][1] == iso(now + timedelta(seconds=300))
    assert body["created_at"] == iso(T0)


def test_patch_can_switch_kind(api, make_schedule):
    make_schedule("s1", interval_seconds=60)
    response = api.patch("/api/schedules/s1", {"cron": "30 6 * * *"})
    assert response.status_code == 200, response.json()
    body = response.json()
    assert (body["kind"], body["cron"], body["interval_seconds"]) == ("cron", "30 6 * * *", None)
    assert body["next_run_at"] == "2026-03-03T06:30:00Z"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"interval_seconds": 0}, "interval_seconds"),
        ({"task_name": "no.such.task"}, "task_name"),
        ({"timezone": "Nowhere/Special"}, "timezone"),
        ({"paused": None}, "paused"),
        ({"run_at": "2020-01-01T00:00:00Z"}, "run_at"),
    ],
)
def test_patch_rejects_bad_input_and_changes_nothing(api, make_schedule, body, field):
    before = make_schedule("s1", interval_seconds=60)
    response = api.patch("/api/schedules/s1", body)
    assert response.status_code == 400
    assert field in response.json()
    after = Schedule.objects.get(name="s1")
    assert (after.interval_seconds, after.task_name, after.updated_at) == (60, "tests.noop", before.updated_at)


def test_delete(api, scheduler, make_schedule):
    make_schedule("s1")
    scheduler.tick()
    response = api.delete("/api/schedules/s1")
    assert response.status_code == 204 and response.content == b""
    assert not Schedule.objects.exists()
    assert api.get("/api/schedules/s1").status_code == 404
    [run] = api.get("/api/runs").json()["results"]  # kept, under the schedule's name
    assert (run["schedule"], run["state"]) == ("s1", "cancelled")
    assert [e["action"] for e in api.get("/api/schedules/s1/history").json()["results"]] == ["delete", "create"]


# --------------------------------------------------------------------------
# actions


def test_pause_and_resume(api, api_clock, make_schedule):
    make_schedule("s1")
    api_clock.advance(seconds=5)
    response = api.post("/api/schedules/s1/pause")
    assert response.status_code == 200
    assert response.json()["paused"] is True
    assert response.json()["updated_at"] == iso(T0 + timedelta(seconds=5))
    assert Schedule.objects.get().paused
    response = api.post("/api/schedules/s1/resume/")
    assert response.status_code == 200 and response.json()["paused"] is False
    assert not Schedule.objects.get().paused


def test_trigger_creates_a_manual_run(api, api_clock, make_schedule):
    make_schedule("s1", task_name="tests.echo", kwargs={"x": 1}, queue="q")
    api_clock.advance(minutes=3)
    response = api.post("/api/schedules/s1/trigger")
    assert response.status_code == 201
    run = response.json()
    assert run["schedule"] == "s1" and run["origin"] == Origin.MANUAL and run["state"] == RunState.PENDING
    assert (run["task_name"], run["kwargs"], run["queue"]) == ("tests.echo", {"x": 1}, "q")
    assert run["scheduled_for"] == iso(T0 + timedelta(minutes=3))
    assert run["idempotency_key"] == f"manual:{run['id']}"
    events = api.get(f"/api/runs/{run['id']}/events").json()["results"]
    assert [(e["event_type"], e["message"]) for e in events] == [("created", "triggered by operator via the API")]


def test_actions_ignore_a_body(api, make_schedule):
    make_schedule("s1")
    assert api.post("/api/schedules/s1/pause", {"paused": False}).status_code == 200
    assert Schedule.objects.get().paused
