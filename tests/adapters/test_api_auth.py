"""REST API access: token and session auth; staff read; change permissions write."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from distsched_app.models import Run, RunState, Schedule

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(api_clock, scheduler, make_schedule):
    """One schedule with one pending run; returns the read URLs and the write requests."""
    make_schedule("s1")
    [run] = scheduler.tick()
    reads = [
        "/api/schedules", "/api/schedules/s1", "/api/runs", f"/api/runs/{run.pk}", f"/api/runs/{run.pk}/events",
        "/api/workers", "/api/stats", "/api/schema", "/api/docs",
    ]
    schedule_writes = [
        ("post", "/api/schedules", {"name": "s2", "task_name": "tests.noop", "interval_seconds": 60}),
        ("patch", "/api/schedules/s1", {"max_attempts": 9}),
        ("post", "/api/schedules/s1/pause", None),
        ("post", "/api/schedules/s1/resume", None),
        ("post", "/api/schedules/s1/trigger", None),
        ("delete", "/api/schedules/s1", None),
    ]
    run_writes = [("post", f"/api/runs/{run.pk}/cancel", None), ("post", f"/api/runs/{run.pk}/requeue", None)]
    return {"reads": reads, "schedule_writes": schedule_writes, "run_writes": run_writes, "run": run}


def call(client, method, url, body=None):
    return getattr(client, method)(url, body, format="json") if body is not None else getattr(client, method)(url)


def test_anonymous_gets_401_with_a_token_challenge(world):
    client = APIClient()
    for url in world["reads"]:
        response = client.get(url)
        assert response.status_code == 401, url
        assert response["WWW-Authenticate"] == "Token"
    for method, url, body in world["schedule_writes"] + world["run_writes"]:
        assert call(client, method, url, body).status_code == 401, (method, url)
    assert Schedule.objects.count() == 1 and Run.objects.get().state == RunState.PENDING


def test_a_bad_token_is_401(world):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    assert client.get("/api/schedules").status_code == 401


def test_an_inactive_users_token_is_401(world, make_api_user, token_client):
    user = make_api_user("gone", superuser=True)
    client = token_client(user)
    user.is_active = False
    user.save()
    assert client.get("/api/schedules").status_code == 401


def test_non_staff_is_403(world, make_api_user, token_client):
    client = token_client(make_api_user("visitor", perms=["change_schedule", "change_run"]))
    for url in world["reads"]:
        assert client.get(url).status_code == 403, url
    for method, url, body in world["schedule_writes"] + world["run_writes"]:
        assert call(client, method, url, body).status_code == 403, (method, url)


def test_staff_without_permissions_may_read_but_not_write(world, make_api_user, token_client):
    client = token_client(make_api_user("reader", staff=True))
    for url in world["reads"]:
        assert client.get(url).status_code == 200, url
    for method, url, body in world["schedule_writes"] + world["run_writes"]:
        response = call(client, method, url, body)
        assert response.status_code == 403, (method, url)
        assert "detail" in response.json()
    schedule = Schedule.objects.get()
    assert (schedule.max_attempts, schedule.paused) == (3, False)
    assert Run.objects.get().state == RunState.PENDING


def test_change_schedule_does_not_grant_run_actions(world, make_api_user, token_client):
    client = token_client(make_api_user("planner", staff=True, perms=["change_schedule"]))
    assert call(client, *world["schedule_writes"][1]).status_code == 200
    assert call(client, *world["schedule_writes"][4]).status_code == 201
    assert call(client, *world["run_writes"][0]).status_code == 403


def test_change_run_does_not_grant_schedule_writes(world, make_api_user, token_client):
    client = token_client(make_api_user("runner", staff=True, perms=["change_run"]))
    assert call(client, *world["run_writes"][0]).status_code == 200
    assert call(client, *world["schedule_writes"][0]).status_code == 403


@pytest.mark.parametrize("who", ["operator", "superuser"])
def test_permitted_staff_may_do_everything(world, make_api_user, token_client, operator, who):
    user = operator if who == "operator" else make_api_user("root", superuser=True)
    client = token_client(user)
    for url in world["reads"]:
        assert client.get(url).status_code == 200, url
    expected = [201, 200, 200, 200, 201, 204]
    assert [call(client, *w).status_code for w in world["schedule_writes"]] == expected
    run = world["run"]
    # That run was deleted with its schedule: cancel and requeue a fresh one of "s2".
    run = Run.objects.create(
        schedule=Schedule.objects.get(name="s2"), task_name="tests.noop", scheduled_for=run.scheduled_for,
        available_at=run.available_at, idempotency_key="k", created_at=run.created_at, updated_at=run.updated_at,
    )
    assert client.post(f"/api/runs/{run.pk}/cancel").status_code == 200
    assert client.post(f"/api/runs/{run.pk}/requeue").status_code == 200


def test_session_authentication(world, operator):
    client = APIClient()
    assert client.login(username="operator", password="pw-operator")
    assert client.get("/api/schedules").status_code == 200
    assert client.post("/api/schedules/s1/pause").status_code == 200


def test_session_writes_need_the_csrf_token(world, operator):
    client = APIClient(enforce_csrf_checks=True)
    client.login(username="operator", password="pw-operator")
    assert client.get("/api/schedules").status_code == 200
    response = client.post("/api/schedules/s1/pause")
    assert response.status_code == 403
    assert "CSRF" in response.json()["detail"]
    assert not Schedule.objects.get().paused
