"""REST API: /api/workers (liveness derived at read time) and /api/stats."""

from __future__ import annotations

from datetime import timedelta

import pytest

from distsched_app.models import WorkerStatus
from distsched_app.services import claiming, outcomes, workers
from tests.conftest import T0
from tests.factories import succeed

pytestmark = pytest.mark.django_db

WORKER_KEYS = {
    "worker_id",
    "hostname",
    "pid",
    "queues",
    "capabilities",
    "status",
    "stale",
    "started_at",
    "heartbeat_at",
    "heartbeat_age_seconds",
    "current_run",
    "clock_skew_seconds",
    "runs_executed",
    "leader",
}


def register(worker_id: str, now, **options):
    defaults = {"hostname": "host-1", "pid": 4242, "queues": ["default"]}
    return workers.register_worker(worker_id=worker_id, now=now, **{**defaults, **options})


@pytest.mark.parametrize("url", ["/api/workers", "/api/workers/"])
def test_workers_with_derived_liveness(api, api_clock, scheduler, make_schedule, settings, url):
    settings.DISTSCHED = {"STALE_AFTER_SECONDS": 30}
    make_schedule("s1")
    [run] = scheduler.tick()
    for worker_id in ("a-fresh", "b-silent", "c-stopped"):
        register(worker_id, api_clock.now(), queues=["default", "slow"])
    workers.set_status(worker_id="c-stopped", status=WorkerStatus.STOPPED, now=api_clock.now())
    api_clock.advance(seconds=45)
    claiming.claim_next_run(worker_id="a-fresh", queues=None, lease_seconds=30, now=api_clock.now())
    workers.heartbeat(
        worker_id="a-fresh", now=api_clock.now(), current_run_id=run.pk, runs_executed=3, clock_skew_seconds=0.25
    )
    api_clock.advance(seconds=5)

    response = api.get(url)
    assert response.status_code == 200
    results = {w["worker_id"]: w for w in response.json()["results"]}
    assert list(results) == ["a-fresh", "b-silent", "c-stopped"]
    fresh, silent, stopped = results["a-fresh"], results["b-silent"], results["c-stopped"]
    assert set(fresh) == WORKER_KEYS
    assert (fresh["stale"], fresh["heartbeat_age_seconds"], fresh["current_run"]) == (False, 5.0, run.pk)
    assert (fresh["runs_executed"], fresh["clock_skew_seconds"], fresh["status"]) == (3, 0.25, "active")
    assert (fresh["hostname"], fresh["pid"], fresh["queues"]) == ("host-1", 4242, ["default", "slow"])
    assert fresh["heartbeat_at"] == (T0 + timedelta(seconds=45)).isoformat().replace("+00:00", "Z")
    assert (silent["stale"], silent["heartbeat_age_seconds"], silent["current_run"]) == (True, 50.0, None)
    assert (stopped["stale"], stopped["status"]) == (False, "stopped")


def test_workers_are_paginated(api, api_clock):
    for k in range(5):
        register(f"w{k}", api_clock.now())
    page = api.get("/api/workers?page_size=2").json()
    seen = [w["worker_id"] for w in page["results"]]
    while page["next"]:
        page = api.get(page["next"]).json()
        seen += [w["worker_id"] for w in page["results"]]
    assert seen == ["w0", "w1", "w2", "w3", "w4"]


def test_workers_list_query_count_does_not_grow(api, api_clock, django_assert_num_queries):
    for k in range(20):
        register(f"w{k:02}", api_clock.now())
    # The token, the user's permissions (own and groups'), the page, the leader row.
    with django_assert_num_queries(5):
        assert len(api.get("/api/workers?page_size=3").json()["results"]) == 3
    with django_assert_num_queries(5):
        assert len(api.get("/api/workers?page_size=20").json()["results"]) == 20


@pytest.mark.parametrize("url", ["/api/stats", "/api/stats/"])
def test_stats(api, api_clock, scheduler, make_schedule, settings, url):
    settings.DISTSCHED = {"STALE_AFTER_SECONDS": 30}
    make_schedule("a", max_attempts=1)
    make_schedule("b")
    make_schedule("c")
    scheduler.pause("c")
    scheduler.tick()
    register("w1", api_clock.now())
    first = claiming.claim_next_run(worker_id="w1", queues=None, lease_seconds=30, now=api_clock.now())
    api_clock.advance(seconds=4)
    succeed(first.pk, worker_id="w1", attempt=1, now=api_clock.now())
    second = claiming.claim_next_run(worker_id="w1", queues=None, lease_seconds=30, now=api_clock.now())
    outcomes.record_failure(run_id=second.pk, worker_id="w1", attempt=1, now=api_clock.now(), error="boom")
    api_clock.advance(seconds=40)

    response = api.get(url)
    assert response.status_code == 200
    body = response.json()
    assert body["runs_by_state"]["succeeded"] == 1
    assert sum(body["runs_by_state"].values()) == 2
    assert (body["schedules_total"], body["schedules_paused"]) == (3, 1)
    assert (body["workers_alive"], body["workers_stale"], body["workers_stopped"]) == (0, 1, 0)
    assert body["mean_duration_seconds"] == 4.0
    assert body["failures_last_24h"] == 1
    [failure] = body["recent_failures"]
    assert (failure["run_id"], failure["message"], failure["attempt"]) == (second.pk, "boom", 1)
    assert failure["at"] == (T0 + timedelta(seconds=4)).isoformat().replace("+00:00", "Z")


def test_workers_and_stats_are_read_only(make_api_user, token_client):
    # Even a superuser gets 405 (not 403): there is simply no such operation.
    client = token_client(make_api_user("root", superuser=True))
    for url in ("/api/workers", "/api/stats"):
        for method in ("post", "put", "patch", "delete"):
            response = getattr(client, method)(url, {})
            assert response.status_code == 405, (method, url)
            assert "GET" in response["Allow"]
