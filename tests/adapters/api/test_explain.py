"""REST API: GET /api/runs/{id}/explain, why a run is not running (``services.explain``)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from distsched_app.models import Run, RunState
from distsched_app.services import claiming, queues
from distsched_app.services.enqueue import Job, enqueue
from distsched_app.services.explain import explain
from tests.conftest import T0

pytestmark = pytest.mark.django_db


@pytest.fixture
def declare(settings):
    def apply(limits_: dict) -> None:
        settings.DISTSCHED = {**settings.DISTSCHED, "LIMITS": limits_}

    return apply


def add(at=T0, **kwargs) -> Run:
    return enqueue(Job(task_name="tests.echo", kwargs=kwargs), now=at).run


def test_a_blocked_run_names_the_limit_and_the_runs_holding_it(api, api_clock, declare):
    declare({"one": {"task": "tests.echo", "concurrency": 1}})
    a, b = add(), add(at=T0 + timedelta(seconds=1))
    api_clock.advance(2)
    claiming.claim_runs(worker_id="w1", queues=None, lease_seconds=30, now=api_clock.now(), limit=1)
    claiming.claim_runs(worker_id="w2", queues=None, lease_seconds=30, now=api_clock.now(), limit=1)
    response = api.get(f"/api/runs/{b.pk}/explain")
    assert response.status_code == 200
    body = response.json()
    assert body == explain(Run.objects.get(pk=b.pk), now=api_clock.now())  # the service's answer, whole
    assert (body["run"], body["state"], body["claimable"], body["next_possible_start"]) == (
        b.pk,
        RunState.BLOCKED,
        False,
        None,
    )
    [reason] = body["waiting_for"]
    assert (reason["kind"], reason["limit"], reason["in_use"], reason["capacity"], reason["holders"]) == (
        "concurrency",
        "one",
        1,
        1,
        [a.pk],
    )
    assert reason["message"].startswith("limit one is full: 1/1 running")


def test_a_paused_queue_and_a_later_slot(api, api_clock):
    run = enqueue(Job(task_name="tests.noop", queue="reports", run_after=T0 + timedelta(hours=1)), now=T0).run
    queues.pause_queue("reports", now=api_clock.now(), by="user:alice", reason="vendor outage")
    body = api.get(f"/api/runs/{run.pk}/explain/").json()
    assert [r["kind"] for r in body["waiting_for"]] == ["queue_paused", "not_due"]
    assert body["waiting_for"][0]["by"] == "user:alice" and body["waiting_for"][1]["at"] == "2026-03-02T10:00:00Z"
    assert body["claimable"] is False and body["next_possible_start"] is None
    assert body == explain(run, now=api_clock.now())


def test_a_finished_run_waits_for_nothing(api, api_clock, scheduler, make_schedule):
    make_schedule("s1")
    [run] = scheduler.tick()
    scheduler.cancel_run(run.pk)
    body = api.get(f"/api/runs/{run.pk}/explain").json()
    assert body == {
        "run": run.pk,
        "state": "cancelled",
        "claimable": False,
        "waiting_for": [],
        "next_possible_start": None,
    }


def test_reading_it_needs_what_reading_runs_needs(api_clock, make_api_user, token_client):
    run = add()
    assert token_client(make_api_user("nobody", staff=True)).get(f"/api/runs/{run.pk}/explain").status_code == 403
    viewer = token_client(make_api_user("viewer", perms=["view_run"]))
    assert viewer.get(f"/api/runs/{run.pk}/explain").status_code == 200
    assert token_client().get(f"/api/runs/{run.pk}/explain").status_code == 401


@pytest.mark.parametrize("run_id", ["999999", "abc", "0"])
def test_an_unknown_run_is_404(api, run_id):
    response = api.get(f"/api/runs/{run_id}/explain")
    assert response.status_code == 404 and "detail" in response.json()


def test_the_schema_describes_the_answer(api):
    schema = api.get("/api/schema?format=json").json()
    operation = schema["paths"]["/api/runs/{id}/explain/"]["get"]
    assert {"200", "401", "403", "404"} <= set(operation["responses"])
    reason = schema["components"]["schemas"]["WaitingReason"]
    assert set(reason["required"]) == {"kind", "message"}
    assert "concurrency" in reason["properties"]["kind"]["description"] or "enum" in str(reason)
