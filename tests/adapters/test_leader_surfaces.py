"""Who leads, wherever an operator looks: /api/workers, /metrics (the CLI and the admin: tests/adapters/cli, admin)."""

from __future__ import annotations

import pytest

from distsched_app.services import workers
from distsched_app.services.leader import DatabaseStore
from tests.adapters.metrics.test_metrics import parse

pytestmark = pytest.mark.django_db


def elect(holder: str):
    term = DatabaseStore().acquire(holder=holder, pid=4242, host="host-1", lease_seconds=60)
    assert term is not None
    return term


def test_api_workers_marks_the_leading_worker(api, api_clock):
    for worker_id in ("w-lead", "w-other"):
        workers.register_worker(worker_id=worker_id, hostname="h", pid=1, queues=["default"], now=api_clock.now())
    elect("w-lead")
    results = api.get("/api/workers").json()["results"]
    assert {w["worker_id"]: w["leader"] for w in results} == {"w-lead": True, "w-other": False}


def test_metrics_say_whether_a_leader_is_present_and_its_term(client, settings):
    settings.DISTSCHED = {"METRICS_PUBLIC": True}
    _, values = parse(client.get("/metrics"))
    assert (values[("distsched_leader_present", ())], values[("distsched_leader_term", ())]) == (0, 0)
    elect("tick-a")
    _, values = parse(client.get("/metrics"))
    assert (values[("distsched_leader_present", ())], values[("distsched_leader_term", ())]) == (1, 1)
