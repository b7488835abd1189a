"""Per-queue and per-task figures (``services.queue_stats``): exact percentiles, depth, oldest
waiting, throughput, workers, limits, pause, and the one-hour window's edges."""

from __future__ import annotations

from datetime import timedelta

import pytest

from distsched_app.errors import NotFound, ValidationError
from distsched_app.models import Run, RunState, Worker, WorkerStatus
from distsched_app.services import queue_stats, queues, workers
from distsched_app.services.enqueue import Job, enqueue
from tests.conftest import T0

pytestmark = pytest.mark.django_db

NOW = T0 + timedelta(hours=2)


def waiting(queue: str, *, at, task: str = "tests.noop") -> Run:
    return enqueue(Job(task_name=task, queue=queue, run_after=at), now=min(at, NOW)).run


def finished(queue: str, *, task: str = "tests.noop", lag: float, took: float, ended, state=RunState.SUCCEEDED) -> Run:
    """A run that was scheduled ``lag + took`` seconds before ``ended``, started ``lag`` s late and ran ``took`` s."""
    started = ended - timedelta(seconds=took)
    scheduled = started - timedelta(seconds=lag)
    run = enqueue(Job(task_name=task, queue=queue), now=scheduled).run
    Run.objects.filter(pk=run.pk).update(
        state=state, started_at=started, finished_at=ended, attempts=1, scheduled_for=scheduled, available_at=scheduled
    )
    return run


def by_queue(found) -> dict:
    return {q.queue: q for q in found}


def test_percentiles_are_nearest_rank():
    p = queue_stats.percentiles([float(v) for v in range(20, 0, -1)])  # 1..20, given unsorted
    assert (p.count, p.p50, p.p95, p.max) == (20, 10.0, 19.0, 20.0)
    one = queue_stats.percentiles([0.25])
    assert (one.p50, one.p95, one.max) == (0.25, 0.25, 0.25)
    none = queue_stats.percentiles([])
    assert (none.count, none.p50, none.p95, none.max) == (0, None, None, None)


def test_start_lag_throughput_and_the_window_edges():
    for i in range(1, 21):  # lags of 1..20 s, ending across the last hour
        finished("reports", lag=i, took=0.5, ended=NOW - timedelta(minutes=i * 2))
    finished("reports", lag=500, took=1, ended=NOW - timedelta(minutes=61))  # before the window
    finished("reports", lag=900, took=1, ended=NOW - timedelta(minutes=59), state=RunState.CANCELLED)
    found = by_queue(queue_stats.queue_stats(now=NOW))["reports"]
    # The cancelled run counts as finished, not in the lag percentiles; the one of 61 minutes ago in neither.
    assert (found.start_lag.count, found.start_lag.p50, found.start_lag.p95) == (20, 10.0, 19.0)
    assert found.start_lag.max == 20.0
    assert found.finished_last_hour == 21
    assert found.throughput_per_minute == pytest.approx(21 / 60)


def test_lag_is_exact_to_the_microsecond():
    finished("fast", lag=0.000250, took=0.001, ended=NOW - timedelta(minutes=1))
    assert by_queue(queue_stats.queue_stats(now=NOW))["fast"].start_lag.p50 == 0.00025


def test_depth_oldest_waiting_and_pause():
    waiting("reports", at=NOW - timedelta(minutes=5))
    waiting("reports", at=NOW - timedelta(minutes=1))
    waiting("reports", at=NOW + timedelta(minutes=30))  # not due yet: not waiting
    queues.pause_queue("reports", now=NOW, by="user:alice", reason="vendor outage")
    found = by_queue(queue_stats.queue_stats(now=NOW))["reports"]
    assert found.runs == {"pending": 3, "retrying": 0, "blocked": 0, "leased": 0, "running": 0}
    assert found.depth == 3
    assert found.oldest_waiting_at == NOW - timedelta(minutes=5)
    assert found.oldest_waiting_seconds == 300.0
    assert found.paused and found.pause.reason == "vendor outage"
    assert (found.start_lag.count, found.finished_last_hour) == (0, 0)


def test_workers_serving_a_queue_are_the_alive_ones_naming_it_or_serving_all():
    workers.register_worker(worker_id="all", hostname="h", pid=1, queues=[], now=NOW)
    workers.register_worker(worker_id="reports-1", hostname="h", pid=2, queues=["reports"], now=NOW)
    workers.register_worker(worker_id="other", hostname="h", pid=3, queues=["other"], now=NOW)
    workers.register_worker(worker_id="silent", hostname="h", pid=4, queues=["reports"], now=NOW - timedelta(hours=1))
    workers.register_worker(worker_id="gone", hostname="h", pid=5, queues=["reports"], now=NOW)
    Worker.objects.filter(worker_id="gone").update(status=WorkerStatus.STOPPED)
    waiting("reports", at=NOW)
    found = by_queue(queue_stats.queue_stats(now=NOW))
    assert found["reports"].workers == ["all", "reports-1"]
    # A queue only a worker names is listed too, with nothing in it.
    assert found["other"].workers == ["all", "other"] and found["other"].depth == 0


def test_limits_that_apply_by_queue_or_by_a_task_of_its_runs(settings):
    settings.DISTSCHED = {
        **settings.DISTSCHED,
        "LIMITS": {
            "by-queue": {"queue": "reports", "concurrency": 2},
            "by-task": {"task": "tests.echo", "concurrency": 1},
            "elsewhere": {"queue": "other", "concurrency": 1},
        },
    }
    finished("reports", task="tests.echo", lag=1, took=1, ended=NOW - timedelta(minutes=3))
    finished("plain", lag=1, took=1, ended=NOW - timedelta(minutes=3))
    found = by_queue(queue_stats.queue_stats(now=NOW))
    assert found["reports"].limits == ["by-queue", "by-task"]
    assert found["plain"].limits == []


def test_queue_detail_and_its_errors():
    waiting("reports", at=NOW)
    assert queue_stats.queue_detail("reports", now=NOW).depth == 1
    with pytest.raises(NotFound):
        queue_stats.queue_detail("nothing-here", now=NOW)
    with pytest.raises(ValidationError):
        queue_stats.queue_detail("bad name!", now=NOW)


def test_task_timings_slowest_first_with_failures():
    for took in (1, 2, 3, 4):
        finished("default", task="tests.record", lag=0, took=took, ended=NOW - timedelta(minutes=took))
    finished("default", task="tests.record", lag=0, took=10, ended=NOW - timedelta(minutes=9), state=RunState.DEAD)
    finished("default", task="tests.echo", lag=0, took=0.002, ended=NOW - timedelta(minutes=2))
    finished("default", task="tests.fail", lag=0, took=99, ended=NOW - timedelta(hours=3))  # outside the window
    finished("default", task="tests.crash", lag=0, took=1, ended=NOW, state=RunState.CANCELLED)
    slow, fast = queue_stats.task_timings(now=NOW)
    assert (slow.task_name, slow.finished, slow.failures) == ("tests.record", 5, 1)
    assert (slow.duration.p50, slow.duration.p95, slow.duration.max) == (3.0, 10.0, 10.0)
    assert (fast.task_name, fast.finished, fast.failures, fast.duration.p95) == ("tests.echo", 1, 0, 0.002)
    assert [t.task_name for t in queue_stats.task_timings(now=NOW, limit=1)] == ["tests.record"]
