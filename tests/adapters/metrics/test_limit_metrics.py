"""``GET /metrics``: the flow-control gauges, one series per declared limit (no partition label)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from distsched_app.services import claiming, limit_overrides
from distsched_app.services.enqueue import Job, enqueue
from tests.adapters.metrics.test_metrics import parse
from tests.conftest import T0

pytestmark = pytest.mark.django_db

GAUGES = [
    "distsched_limit_capacity",
    "distsched_limit_in_use",
    "distsched_limit_blocked_runs",
    "distsched_limit_throttled_runs",
    "distsched_limit_partitions_saturated",
    "distsched_limit_overridden",
]
LIMITS = {
    "one": {"task": "tests.echo", "concurrency": 1},
    "gpu": {"task": "tests.noop", "total": 4, "concurrency": 2, "partition_by": ["tenant"]},
    "partner": {"queue": "partner", "rate": "1/m", "partition_by": ["partner"]},
}


@pytest.fixture
def limits(settings, clock):
    settings.DISTSCHED = {"METRICS_PUBLIC": True, "LIMITS": LIMITS}


def by_limit(values: dict) -> dict[str, dict[str, float]]:
    """metric name -> {limit: value}."""
    out: dict[str, dict[str, float]] = {name: {} for name in GAUGES}
    for (name, labels), value in values.items():
        if name in out:
            assert [k for k, _ in labels] == ["limit"], labels  # never a partition label
            out[name][dict(labels)["limit"]] = value
    return out


def claim(clock, n: int = 10) -> None:
    claiming.claim_runs(worker_id="w1", queues=None, lease_seconds=30, now=clock.now(), limit=n, start_all=True)


def test_without_limits_every_family_is_served_empty_and_nothing_is_queried(client, settings, clock):
    settings.DISTSCHED = {"METRICS_PUBLIC": True}
    types, values = parse(client.get("/metrics"))
    for name in GAUGES:
        assert types[name] == "gauge"
    assert by_limit(values) == {name: {} for name in GAUGES}


def test_the_gauges_of_each_limit(client, limits, clock):
    for i in range(3):
        enqueue(Job(task_name="tests.echo"), now=T0 + timedelta(seconds=i))
    for tenant in ("a", "a", "a", "b"):
        enqueue(Job(task_name="tests.noop", kwargs={"tenant": tenant}), now=T0)
    for _ in range(2):
        enqueue(Job(task_name="tests.record", queue="partner", kwargs={"partner": "acme"}), now=T0)
    clock.advance(5)
    claim(clock)
    _, values = parse(client.get("/metrics"))
    gauges = by_limit(values)
    # one: 1 running, 1 blocked by it; gpu: a holds its 2 (one a blocked), b 1; partner: one started, one throttled.
    assert gauges["distsched_limit_capacity"] == {"one": 1, "gpu": 4}  # partner has only a rate: no series
    assert gauges["distsched_limit_in_use"]["gpu"] == 3
    assert gauges["distsched_limit_blocked_runs"]["gpu"] == 1
    assert gauges["distsched_limit_partitions_saturated"]["gpu"] == 1
    assert gauges["distsched_limit_throttled_runs"]["partner"] == 1
    assert gauges["distsched_limit_overridden"] == {"one": 0, "gpu": 0, "partner": 0}
    statuses = {s.name: s for s in limit_overrides.status(clock.now())}
    for name, status in statuses.items():  # the same figures as the API and the CLI show
        assert gauges["distsched_limit_in_use"][name] == status.in_use
        assert gauges["distsched_limit_blocked_runs"][name] == status.blocked
        assert gauges["distsched_limit_throttled_runs"][name] == status.throttled
        assert gauges["distsched_limit_partitions_saturated"][name] == status.saturated_partitions
    assert sum(gauges["distsched_limit_in_use"].values()) >= 4


def test_an_override_shows_in_capacity_and_overridden_until_reset(client, limits, clock):
    limit_overrides.set_override("one", {"concurrency": 5}, now=clock.now(), by="user:ops", for_seconds=60)
    limit_overrides.set_override("partner", {"concurrency": 3}, now=clock.now(), by="user:ops")
    gauges = by_limit(parse(client.get("/metrics"))[1])
    assert gauges["distsched_limit_overridden"] == {"one": 1, "gpu": 0, "partner": 1}
    assert gauges["distsched_limit_capacity"] == {"one": 5, "gpu": 4, "partner": 3}
    clock.advance(61)  # one's override has expired (the sweep has not run: the status already ignores it)
    limit_overrides.reset_override("partner", now=clock.now(), by="user:ops")
    gauges = by_limit(parse(client.get("/metrics"))[1])
    assert gauges["distsched_limit_overridden"] == {"one": 0, "gpu": 0, "partner": 0}
    assert gauges["distsched_limit_capacity"] == {"one": 1, "gpu": 4}


def test_queries_do_not_grow_with_runs_and_none_without_limits(client, limits, settings, clock):
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            client.get("/metrics")
        return len(captured)

    before = queries()
    for tenant in ("a", "b", "c", "d", "e"):
        enqueue(Job(task_name="tests.noop", kwargs={"tenant": tenant}), now=clock.now())
    clock.advance(1)
    claim(clock)
    assert queries() == before
    settings.DISTSCHED = {"METRICS_PUBLIC": True}
    # the snapshot's ten (one of them the lookup of its three stored figures, services.figures), workflows
    # by state and the leader row, as before limits existed
    assert queries() == 13


def test_a_malformed_limits_setting_does_not_break_the_scrape(client, settings):
    settings.DISTSCHED = {"METRICS_PUBLIC": True, "LIMITS": {"x": {"concurrency": 1}}}
    response = client.get("/metrics")
    assert response.status_code == 200
    assert by_limit(parse(response)[1]) == {name: {} for name in GAUGES}
