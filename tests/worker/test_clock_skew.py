"""Clock skew between a worker and the database, and what skew does to leases."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from distsched_app import FakeClock
from distsched_app.models import EventType, Run, RunEvent, RunState
from distsched_app.models import Worker as WorkerRow
from distsched_app.services import workers as worker_service
from distsched_app.worker import Worker
from tests.conftest import T0
from tests.testapp import tasks as test_tasks

pytestmark = pytest.mark.django_db

WARNING = "clock skew with the database exceeds MAX_CLOCK_SKEW_SECONDS"


def skew_warnings(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == WARNING]


@pytest.mark.postgres
def test_skew_is_measured_against_postgresql_and_stored():
    skew = worker_service.measure_clock_skew()
    assert skew is not None and abs(skew) < 1.0  # same machine
    worker = Worker(worker_id="real-clock", heartbeat_seconds=3600)  # the system clock
    worker.register()
    stored = WorkerRow.objects.get(worker_id="real-clock").clock_skew_seconds
    assert stored is not None and abs(stored) < 1.0


@pytest.mark.postgres
def test_a_local_clock_ahead_of_the_database_measures_positive(monkeypatch):
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(seconds=10))
    assert worker_service.measure_clock_skew() == pytest.approx(10.0, abs=1.0)


def test_sqlite_shares_the_machine_clock_so_nothing_is_measured():
    if connection.vendor != "sqlite":
        pytest.skip("SQLite-only")
    assert worker_service.measure_clock_skew() is None
    Worker(worker_id="local", heartbeat_seconds=3600).register()
    assert WorkerRow.objects.get(worker_id="local").clock_skew_seconds is None


@pytest.mark.parametrize("skew", [5.0, -5.0])
def test_skew_above_the_limit_logs_a_warning_and_is_stored(monkeypatch, caplog, skew):
    monkeypatch.setattr(worker_service, "measure_clock_skew", lambda: skew)
    worker = Worker(worker_id="skewed", heartbeat_seconds=3600)
    with caplog.at_level(logging.WARNING, logger="distsched"):
        worker.register()
    [record] = skew_warnings(caplog)
    assert record.levelno == logging.WARNING
    assert record.distsched["skew_seconds"] == f"{skew:.3f}"
    assert record.distsched["limit"] == 2
    assert record.distsched["worker_id"] == "skewed"
    assert WorkerRow.objects.get(worker_id="skewed").clock_skew_seconds == skew


def test_skew_is_refreshed_and_warned_about_on_every_heartbeat(monkeypatch, caplog):
    values = iter([0.1, 7.5])
    monkeypatch.setattr(worker_service, "measure_clock_skew", lambda: next(values))
    worker = Worker(worker_id="drifting", heartbeat_seconds=3600)
    with caplog.at_level(logging.WARNING, logger="distsched"):
        worker.register()
        assert skew_warnings(caplog) == []
        worker.heartbeat()  # the clock has drifted since start
    assert len(skew_warnings(caplog)) == 1
    assert WorkerRow.objects.get(worker_id="drifting").clock_skew_seconds == 7.5


@pytest.mark.parametrize(("skew", "limit"), [(1.0, None), (5.0, 10)])
def test_skew_within_the_limit_is_stored_without_a_warning(monkeypatch, caplog, settings, skew, limit):
    if limit is not None:
        settings.DISTSCHED = {"MAX_CLOCK_SKEW_SECONDS": limit}
    monkeypatch.setattr(worker_service, "measure_clock_skew", lambda: skew)
    with caplog.at_level(logging.WARNING, logger="distsched"):
        Worker(worker_id="fine", heartbeat_seconds=3600).register()
    assert skew_warnings(caplog) == []
    assert WorkerRow.objects.get(worker_id="fine").clock_skew_seconds == skew


def test_an_injected_clock_is_not_compared_with_the_database(monkeypatch, scheduler):
    def unexpected():
        raise AssertionError("measured with a fake clock")

    monkeypatch.setattr(worker_service, "measure_clock_skew", unexpected)
    worker = scheduler.worker(worker_id="fake", heartbeat_seconds=3600)
    assert worker.check_clock_skew() is None
    worker.register()
    assert WorkerRow.objects.get(worker_id="fake").clock_skew_seconds is None


def test_a_worker_whose_clock_runs_ahead_by_more_than_the_lease_steals_runs_but_fencing_holds(scheduler):
    """Why the warning matters: B's clock is 40 s ahead, so A's fresh 30 s lease already
    looks expired to B. B re-executes the run; A's late success is discarded (lease_lost)."""
    scheduler.create_schedule(name="skew", task_name="tests.hook", interval_seconds=3600, kwargs={"name": "skew"})
    [run] = scheduler.tick()
    ahead = FakeClock(T0 + timedelta(seconds=40))
    a = scheduler.worker(worker_id="a", lease_seconds=30, heartbeat_seconds=3600)
    b = Worker(worker_id="b", lease_seconds=30, heartbeat_seconds=3600, clock=ahead)
    seen = {}

    def hook(context):
        if context.worker_id == "a":
            seen["b"] = b.run_once()  # while A is still running it, healthy
        return context.worker_id

    test_tasks.HOOKS["skew"] = hook
    a_result = a.run_once()
    assert seen["b"].state == RunState.SUCCEEDED
    assert a_result.state is None  # discarded by fencing
    run.refresh_from_db()
    assert (run.state, run.attempts, run.result) == (RunState.SUCCEEDED, 2, "b")
    kinds = list(RunEvent.objects.filter(run=run).order_by("id").values_list("event_type", flat=True))
    assert EventType.LEASE_EXPIRED in kinds and kinds[-1] == EventType.LEASE_LOST
    assert Run.objects.count() == 1
