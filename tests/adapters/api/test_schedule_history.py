"""REST API: a schedule's history, restore, PATCH with expected_version (409), reasons, actors."""

from __future__ import annotations

import pytest

from distsched_app.models import AuditEntry, Schedule

pytestmark = pytest.mark.django_db

ENTRY_KEYS = {"id", "version", "at", "action", "actor", "source", "reason", "changes", "snapshot", "run", "restored"}


def test_history_is_newest_first_and_paginated(api, api_clock, make_schedule):
    make_schedule("s1", interval_seconds=60)
    api_clock.advance(seconds=5)
    assert api.patch("/api/schedules/s1", {"max_attempts": 5, "reason": "flaky"}).status_code == 200
    assert api.post("/api/schedules/s1/pause", {"reason": "vendor outage"}).status_code == 200
    assert api.post("/api/schedules/s1/trigger").status_code == 201
    response = api.get("/api/schedules/s1/history?page_size=2")
    assert response.status_code == 200
    body = response.json()
    assert [(e["version"], e["action"]) for e in body["results"]] == [(3, "trigger"), (3, "pause")]
    assert set(body["results"][0]) == ENTRY_KEYS
    pause = body["results"][1]
    assert (pause["actor"], pause["source"], pause["reason"]) == ("user:operator", "api", "vendor outage")
    assert pause["changes"] == {"paused": [False, True]} and pause["snapshot"]["paused"] is True
    rest = api.get(body["next"]).json()["results"]
    assert [(e["version"], e["action"]) for e in rest] == [(2, "update"), (1, "create")]
    assert rest[0]["changes"] == {"max_attempts": [3, 5]} and rest[0]["reason"] == "flaky"
    assert rest[0]["at"] == "2026-03-02T09:00:05Z"
    assert rest[1]["actor"] == "code"  # made by make_schedule, in code


def test_the_history_of_a_deleted_schedule_stays_readable(api, make_schedule):
    make_schedule("s1")
    assert api.delete("/api/schedules/s1").status_code == 204
    [deleted, created] = api.get("/api/schedules/s1/history").json()["results"]
    assert (deleted["action"], deleted["version"], deleted["actor"]) == ("delete", 2, "user:operator")
    assert deleted["snapshot"]["interval_seconds"] == 60 and created["action"] == "create"


def test_history_of_an_unknown_schedule_is_404(api):
    assert api.get("/api/schedules/nope/history").status_code == 404
    assert api.get("/api/schedules/bad%00name/history").status_code == 404


def test_history_costs_the_same_few_queries_whatever_its_length(
    api, scheduler, make_schedule, django_assert_num_queries
):
    make_schedule("s1")
    for n in range(30):
        scheduler.update_schedule("s1", max_attempts=n + 4)
    # auth (token, user), permission check, existence, the page.
    with django_assert_num_queries(5):
        assert len(api.get("/api/schedules/s1/history?page_size=25").json()["results"]) == 25


def test_restore_makes_a_new_version(api, scheduler, make_schedule):
    make_schedule("s1", interval_seconds=60)
    scheduler.update_schedule("s1", interval_seconds=900)
    response = api.post("/api/schedules/s1/restore", {"version": 1, "reason": "900 was a typo"})
    assert response.status_code == 200, response.json()
    body = response.json()
    assert (body["version"], body["interval_seconds"]) == (3, 60)
    [latest, *_] = api.get("/api/schedules/s1/history").json()["results"]
    assert (latest["action"], latest["restored"], latest["changes"]) == (
        "restore", 1, {"interval_seconds": [900, 60]},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"version": 9}, 404, "detail"),
        ({"version": 0}, 400, "version"),
        ({"version": "1"}, 400, "version"),
        ({}, 400, "version"),
        ({"version": 1, "reason": 5}, 400, "reason"),
        ({"version": 1, "reason": "x" * 1001}, 400, "reason"),
        ({"version": 1, "expected_version": 7}, 409, "detail"),
    ],
)
def test_restore_refusals(api, make_schedule, body, status, field):
    make_schedule("s1")
    response = api.post("/api/schedules/s1/restore", body)
    assert response.status_code == status
    assert field in response.json()
    assert Schedule.objects.get().version == 1 and AuditEntry.objects.count() == 1


def test_restore_of_an_unknown_schedule_is_404_whatever_the_body(api):
    assert api.post("/api/schedules/nope/restore", {"version": "x"}).status_code == 404


def test_patch_with_the_expected_version(api, scheduler, make_schedule):
    make_schedule("s1")
    ok = api.patch("/api/schedules/s1", {"max_attempts": 5, "expected_version": 1})
    assert ok.status_code == 200 and ok.json()["version"] == 2
    stale = api.patch("/api/schedules/s1", {"max_attempts": 9, "expected_version": 1})
    assert stale.status_code == 409
    assert stale.json()["version"] == 2 and "version 2, not 1" in stale.json()["detail"]
    assert Schedule.objects.get().max_attempts == 5
    assert api.patch("/api/schedules/s1", {"expected_version": "2"}).status_code == 400
    assert "expected_version" in api.patch("/api/schedules/s1", {"expected_version": 0}).json()


def test_a_patch_that_changes_nothing_is_no_version(api, make_schedule):
    make_schedule("s1", interval_seconds=60)
    assert api.patch("/api/schedules/s1", {"interval_seconds": 60}).json()["version"] == 1
    assert AuditEntry.objects.count() == 1


def test_create_records_the_requests_user_and_reason(api):
    body = {"name": "n1", "task_name": "tests.noop", "interval_seconds": 60, "reason": "new report"}
    response = api.post("/api/schedules", body)
    assert response.status_code == 201 and response.json()["version"] == 1
    assert "expected_version" not in response.json()
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.actor, entry.source, entry.reason) == ("create", "user:operator", "api", "new report")


def test_run_actions_record_the_actor_and_reason(api, scheduler, make_schedule):
    make_schedule("s1")
    [run] = scheduler.tick()
    assert api.post(f"/api/runs/{run.pk}/cancel", {"reason": "bad input"}).status_code == 200
    assert api.post(f"/api/runs/{run.pk}/requeue").status_code == 200
    entries = AuditEntry.objects.filter(target_kind="run").order_by("id")
    assert [(e.action, e.actor, e.source, e.reason) for e in entries] == [
        ("cancel", "user:operator", "api", "bad input"),
        ("requeue", "user:operator", "api", ""),
    ]
    assert api.post(f"/api/runs/{run.pk}/cancel", {"reason": ["x"]}).status_code == 400


def test_a_runs_schedule_version_and_deleted_schedule(api, scheduler, make_schedule):
    make_schedule("s1")
    [run] = scheduler.tick()
    assert api.get(f"/api/runs/{run.pk}").json()["schedule_version"] == 1
    api.delete("/api/schedules/s1")
    body = api.get(f"/api/runs/{run.pk}").json()
    assert (body["schedule"], body["schedule_version"], body["state"]) == ("s1", 1, "cancelled")
    assert [r["schedule"] for r in api.get("/api/runs").json()["results"]] == ["s1"]


def test_history_needs_read_and_restore_change_permission(make_api_user, token_client, make_schedule, api_clock):
    make_schedule("s1")
    viewer = token_client(make_api_user("viewer", perms=["view_schedule"]))
    assert viewer.get("/api/schedules/s1/history").status_code == 200
    assert viewer.post("/api/schedules/s1/restore", {"version": 1}).status_code == 403
    assert token_client().get("/api/schedules/s1/history").status_code == 401
