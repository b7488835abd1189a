"""REST API: /api/limits (list, show with history), override (PATCH) and reset; permissions and errors."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from distsched_app.models import LimitEvent, Run, RunState
from distsched_app.services import claiming, limit_overrides
from distsched_app.services.enqueue import Job, enqueue
from tests.conftest import T0

pytestmark = pytest.mark.django_db

NOW = "2026-03-02T09:00:00Z"
LIMITS = {
    "one": {"task": "tests.echo", "concurrency": 1},
    "partner": {"task": "tests.noop", "rate": "2/s", "partition_by": ["partner"], "missing": "shared"},
}
DECLARED_ONE = {"concurrency": 1, "total": None, "rate": None, "burst": 1, "local": None, "paused": False}


@pytest.fixture
def limits(settings):
    settings.DISTSCHED = {**settings.DISTSCHED, "LIMITS": LIMITS}


@pytest.fixture
def limit_user(make_api_user, token_client):
    """``limit_user("view_limit")``: a client holding just that permission."""

    def make(*perms: str):
        return token_client(make_api_user("u-" + "-".join(perms) if perms else "u-none", perms=list(perms)))

    return make


@pytest.fixture
def changer(limit_user):
    return limit_user("change_limit")


def blocked_world(clock) -> list[Run]:
    """Three runs under "one" (concurrency 1): one running, two blocked."""
    runs = [enqueue(Job(task_name="tests.echo"), now=T0 + timedelta(seconds=i)).run for i in range(3)]
    clock.advance(5)
    claiming.claim_runs(worker_id="w1", queues=None, lease_seconds=30, now=clock.now(), limit=3, start_all=True)
    assert sorted(Run.objects.values_list("state", flat=True)) == [RunState.BLOCKED, RunState.BLOCKED, RunState.RUNNING]
    return runs


def test_list_shows_every_declared_limit_with_its_figures(limits, limit_user, api_clock):
    blocked_world(api_clock)
    response = limit_user("view_limit").get("/api/limits")
    assert response.status_code == 200, response.content
    body = response.json()
    assert [limit["name"] for limit in body] == ["one", "partner"]
    assert body[0] == {
        "name": "one",
        "tasks": ["tests.echo"],
        "queues": [],
        "partition_by": [],
        "fair": False,
        "declared": DECLARED_ONE,
        "override": None,
        "effective": DECLARED_ONE,
        "in_use": 1,
        "blocked": 2,
        "throttled": 0,
        "saturated_partitions": 1,
        "top_partitions": [{"partition": "", "blocked": 2, "in_use": 1}],
    }
    assert body[1]["effective"]["rate"] == "2/s" and body[1]["partition_by"] == ["partner"]


def test_list_without_limits_is_empty(api):
    response = api.get("/api/limits")
    assert (response.status_code, response.json()) == (200, [])


def test_override_lets_blocked_runs_through_and_is_audited(limits, changer, api_clock):
    blocked_world(api_clock)
    response = changer.patch("/api/limits/one", {"concurrency": 3, "reason": "backlog", "for_seconds": 600})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["released"] == 2
    assert body["override"] == {
        "values": {"concurrency": 3},
        "by": "user:u-change_limit",
        "reason": "backlog",
        "until": "2026-03-02T09:10:05Z",
    }
    assert body["effective"]["concurrency"] == 3 and body["declared"]["concurrency"] == 1
    assert (body["blocked"], body["in_use"]) == (0, 1)
    assert Run.objects.filter(state=RunState.BLOCKED).count() == 0
    event = LimitEvent.objects.get()
    assert (event.limit, event.action, event.actor, event.reason, event.override) == (
        "one",
        "set",
        "user:u-change_limit",
        "backlog",
        {"concurrency": 3},
    )
    assert event.until == T0 + timedelta(seconds=605)


def test_override_with_until_pause_and_dropped_numbers(limits, api, api_clock):
    response = api.patch("/api/limits/partner", {"rate": None, "paused": True, "until": "2026-03-02T12:00:00+01:00"})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["override"]["values"] == {"rate": None, "paused": True}
    assert body["override"]["until"] == "2026-03-02T11:00:00Z"
    assert (body["effective"]["rate"], body["effective"]["paused"]) == (None, True)
    assert body["declared"]["rate"] == "2/s"


def test_a_second_override_replaces_the_first(limits, api, api_clock):
    api.patch("/api/limits/one", {"concurrency": 5, "paused": True})
    body = api.patch("/api/limits/one", {"local": 2}).json()
    assert body["override"]["values"] == {"local": 2}
    assert (body["effective"]["concurrency"], body["effective"]["paused"], body["effective"]["local"]) == (1, False, 2)
    assert LimitEvent.objects.count() == 2


def test_show_has_the_status_and_the_history_newest_first(limits, api, api_clock):
    api.patch("/api/limits/one", {"concurrency": 2, "reason": "first"})
    api_clock.advance(60)
    api.post("/api/limits/one/reset", {"reason": "done"})
    response = api.get("/api/limits/one")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["override"] is None and body["effective"] == DECLARED_ONE
    assert [(e["action"], e["actor"], e["reason"], e["override"]) for e in body["history"]] == [
        ("reset", "user:operator", "done", None),
        ("set", "user:operator", "first", {"concurrency": 2}),
    ]
    assert body["history"][1]["created_at"] == NOW
    assert set(body["history"][0]) == {"id", "action", "actor", "reason", "override", "until", "created_at"}


def test_reset_goes_back_to_the_declaration_and_a_second_reset_writes_nothing(limits, api, api_clock):
    runs = blocked_world(api_clock)
    api.patch("/api/limits/one", {"paused": True})
    response = api.post("/api/limits/one/reset")  # no body: no reason
    assert response.status_code == 200, response.content
    assert (response.json()["override"], response.json()["released"]) == (None, 0)
    assert list(LimitEvent.objects.order_by("id").values_list("action", "actor", "reason")) == [
        ("set", "user:operator", ""),
        ("reset", "user:operator", ""),
    ]
    assert api.post("/api/limits/one/reset", {"reason": "again"}).status_code == 200
    assert LimitEvent.objects.count() == 2
    assert Run.objects.get(pk=runs[0].pk).state == RunState.RUNNING


def test_an_expired_override_is_not_shown(limits, api, api_clock):
    api.patch("/api/limits/one", {"concurrency": 4, "for_seconds": 30})
    api_clock.advance(31)
    body = api.get("/api/limits/one").json()
    assert body["override"] is None and body["effective"]["concurrency"] == 1


@pytest.mark.parametrize(
    ("method", "url"),
    [("get", "/api/limits/nope"), ("patch", "/api/limits/nope"), ("post", "/api/limits/nope/reset")],
)
def test_an_unknown_limit_is_404_whatever_the_body(limits, api, api_clock, method, url):
    response = getattr(api, method)(url, {"concurrency": "not a number"}, format="json")
    assert response.status_code == 404, response.content
    assert response.json() == {"detail": "no limit named 'nope' is declared in DISTSCHED['LIMITS']"}
    assert not LimitEvent.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"concurrency": "3"}, "concurrency"),
        ({"concurrency": -1}, "concurrency"),
        ({"concurrency": 1.5}, "concurrency"),
        ({"total": True}, "total"),
        ({"local": 0}, "local"),
        ({"burst": 0}, "burst"),
        ({"rate": "5/w"}, "rate"),
        ({"rate": "0/s"}, "rate"),
        ({"rate": 5}, "rate"),
        ({"paused": "yes"}, "paused"),
        ({"paused": None}, "paused"),
        ({"concurrency": 2, "for_seconds": 0}, "for_seconds"),
        ({"concurrency": 2, "for_seconds": "10"}, "for_seconds"),
        ({"concurrency": 2, "for_seconds": 60, "until": "2030-01-01T00:00:00Z"}, "for_seconds"),
        ({"concurrency": 2, "until": "2026-03-02T08:00:00Z"}, "until"),
        ({"concurrency": 2, "until": "2026-03-02T12:00:00"}, "until"),
        ({"concurrency": 2, "reason": 5}, "reason"),
        ({"concurrency": 2, "reason": "nul\x00"}, "reason"),
        ({}, "non_field_errors"),
        ({"reason": "only a reason"}, "non_field_errors"),
        (["concurrency"], "non_field_errors"),
    ],
)
def test_bad_input_is_400_on_its_field_and_writes_nothing(limits, api, api_clock, body, field):
    response = api.patch("/api/limits/one", body, format="json")
    assert response.status_code == 400, response.content
    assert list(response.json()) == [field], response.json()
    assert not LimitEvent.objects.exists()
    assert limit_overrides.status(api_clock.now(), name="one")[0].override is None


def test_a_bad_reset_body_is_400(limits, api, api_clock):
    api.patch("/api/limits/one", {"paused": True})
    for body in ({"reason": 5}, ["reason"]):
        assert api.post("/api/limits/one/reset", body, format="json").status_code == 400
    assert LimitEvent.objects.count() == 1


def test_permissions(limits, limit_user, token_client, api_clock):
    viewer, changer, other = limit_user("view_limit"), limit_user("change_limit"), limit_user("view_run")
    for client, read, write in ((viewer, 200, 403), (changer, 200, 200), (other, 403, 403)):
        assert client.get("/api/limits").status_code == read
        assert client.get("/api/limits/one").status_code == read
        assert client.patch("/api/limits/one", {"concurrency": 2}).status_code == write
        assert client.post("/api/limits/one/reset").status_code == write
    anonymous = token_client()
    for response in (anonymous.get("/api/limits"), anonymous.patch("/api/limits/one", {"concurrency": 2})):
        assert response.status_code == 401
        assert response["WWW-Authenticate"] == "Token"
    assert [e.actor for e in LimitEvent.objects.order_by("id")] == ["user:u-change_limit", "user:u-change_limit"]


def test_put_and_delete_are_405(limits, api):
    assert api.put("/api/limits/one", {"concurrency": 2}).status_code == 405
    assert api.delete("/api/limits/one").status_code == 405
    assert api.post("/api/limits", {}).status_code == 405


def test_a_malformed_limits_setting_is_a_400_not_a_500(settings, api):
    settings.DISTSCHED = {"LIMITS": {"x": {"concurrency": 1}}}
    response = api.get("/api/limits")
    assert response.status_code == 400
    assert "applies to nothing" in str(response.json())


def test_list_query_count_does_not_grow_with_runs_or_partitions(limits, api, api_clock):
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert len(api.get("/api/limits").json()) == 2
        return len(captured)

    before = queries()
    blocked_world(api_clock)
    for partner in ("acme", "globex", "initech"):
        enqueue(Job(task_name="tests.noop", kwargs={"partner": partner}), now=api_clock.now())
    claiming.claim_runs(worker_id="w2", queues=None, lease_seconds=30, now=api_clock.now(), limit=5, start_all=True)
    assert queries() == before


def test_the_schema_documents_the_limit_endpoints(limits, api):
    schema = api.get("/api/schema?format=json").json()
    paths = schema["paths"]
    assert {"/api/limits/", "/api/limits/{name}/", "/api/limits/{name}/reset/"} <= set(paths)
    patch = paths["/api/limits/{name}/"]["patch"]
    assert {"200", "400", "401", "403", "404", "413", "415"} <= set(patch["responses"])
    ref = patch["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    assert set(schema["components"]["schemas"][ref]["properties"]) == {
        "concurrency", "total", "rate", "burst", "local", "paused", "reason", "for_seconds", "until",
    }  # fmt: skip
    assert {"200", "404"} <= set(paths["/api/limits/{name}/"]["get"]["responses"])
