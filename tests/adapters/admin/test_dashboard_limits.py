"""The admin dashboard's "Saturated limits": limits that are full or have blocked runs."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from django.urls import reverse

from distsched_app.services import claiming, limit_overrides, limit_summary
from distsched_app.services.enqueue import Job, enqueue
from tests.conftest import T0

pytestmark = pytest.mark.django_db

DASHBOARD = reverse("admin:distsched_dashboard")
LIMITS = {
    "one": {"task": "tests.echo", "concurrency": 1},
    "idle": {"task": "tests.noop", "concurrency": 5},
    "partner": {"queue": "partner", "rate": "1/m"},
}


@pytest.fixture
def limits(settings):
    settings.DISTSCHED = {**settings.DISTSCHED, "LIMITS": LIMITS}


def test_no_section_without_limits(staff):
    response = staff.get(DASHBOARD)
    assert response.status_code == 200
    assert 'id="distsched-limits"' not in response.content.decode()
    assert response.context["saturated_limits"] == []


def test_none_saturated(staff, limits):
    body = staff.get(DASHBOARD).content.decode()
    assert 'id="distsched-limits"' in body
    assert "None: no limit is full and no run waits for one." in body


def test_a_full_limit_with_blocked_runs_is_listed(staff, limits, clock):
    for i in range(3):
        enqueue(Job(task_name="tests.echo"), now=T0 + timedelta(seconds=i))
    enqueue(Job(task_name="tests.noop"), now=T0)
    clock.advance(5)
    claiming.claim_runs(worker_id="w1", queues=None, lease_seconds=30, now=clock.now(), limit=10, start_all=True)
    response = staff.get(DASHBOARD)
    rows = response.context["saturated_limits"]
    assert [(r["status"].name, r["status"].in_use, r["capacity"], r["status"].blocked) for r in rows] == [
        ("one", 1, 1, 2)
    ]
    assert 'data-limit="one"' in response.content.decode()
    assert 'data-limit="idle"' not in response.content.decode()


def test_a_paused_limit_is_saturated_once_runs_wait(staff, limits, clock):
    limit_overrides.set_override("idle", {"paused": True}, now=clock.now(), by="user:ops")
    assert limit_summary.saturated(clock.now()) == []  # nothing waits for it yet
    enqueue(Job(task_name="tests.noop"), now=clock.now())
    clock.advance(1)
    claiming.claim_runs(worker_id="w1", queues=None, lease_seconds=30, now=clock.now(), limit=1)
    body = staff.get(DASHBOARD).content.decode()
    assert 'data-limit="idle"' in body and "by user:ops (paused)" in body


def test_capacity_and_saturation_rules():
    status = limit_overrides.LimitStatus(
        name="x",
        tasks=["t"],
        queues=[],
        declared={},
        override=None,
        override_by="",
        override_reason="",
        override_until=None,
        effective={"concurrency": 2, "total": 8, "rate": None, "burst": 1, "local": None, "paused": False},
        partition_by=["tenant"],
        fair=False,
        in_use=7,
        blocked=0,
        throttled=0,
        saturated_partitions=0,
    )
    assert limit_summary.capacity(status) == 8  # the total wins over the concurrency per partition
    assert not limit_summary.is_saturated(status)  # 7 of 8 in use, no partition full, nothing blocked
    assert limit_summary.is_saturated(replace(status, in_use=8))
    assert limit_summary.is_saturated(replace(status, saturated_partitions=1))
    assert limit_summary.is_saturated(replace(status, blocked=1))
    only_rate = replace(status, effective={**status.effective, "concurrency": None, "total": None, "rate": "1/m"})
    assert limit_summary.capacity(only_rate) is None and not limit_summary.is_saturated(only_rate)
