"""Real processes on the real database: no double claim, no duplicate generated run."""

from __future__ import annotations

import signal
import subprocess
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection

from distsched_app.clock import SystemClock
from distsched_app.models import EventType, Run, RunEvent, RunState
from distsched_app.services import schedules as schedule_service
from tests.concurrency.procs import child_env, finish, manage, wait_for
from tests.conftest import T0
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def test_four_workers_drain_400_runs_without_double_claims(scheduler, clock):
    clock.set(T0 - timedelta(days=1))
    for i in range(400):
        scheduler.create_schedule(
            name=f"r{i}", task_name="tests.record", run_at=T0, max_attempts=1, kwargs={"sleep": 0.002}
        )
    clock.set(T0)
    assert len(scheduler.tick()) == 400
    workers = [manage("runworker", "--burst", f"--worker-id=w{i}", "--poll-interval=0.05") for i in range(4)]
    results = finish(workers, timeout=240)
    for code, _, stderr in results:
        assert code == 0, stderr[-2000:]
    assert Run.objects.filter(state=RunState.SUCCEEDED).count() == 400
    executions = Counter(Execution.objects.values_list("run_id", flat=True))
    assert len(executions) == 400
    assert max(executions.values()) == 1, "a run was executed twice"
    claims = Counter(RunEvent.objects.filter(event_type=EventType.CLAIMED).values_list("run_id", flat=True))
    assert set(claims.values()) == {1}
    per_worker = Counter(Execution.objects.values_list("worker_id", flat=True))
    print(f"\n[{connection.vendor}] 4 workers drained 400 runs: per worker {dict(sorted(per_worker.items()))}")


def test_two_tickers_never_duplicate_runs(scheduler, tmp_path):
    # 100 one-second schedules; two real ticker loops (one leads, the other stands by) for a while.
    real = SystemClock()
    for i in range(100):
        schedule_service.create_schedule(
            name=f"t{i}", task_name="tests.noop", interval_seconds=1, catch_up="all", now=real.now()
        )
    logs = [tmp_path / f"ticker{i}.log" for i in range(2)]
    env = child_env(DISTSCHED_LOG_LEVEL="INFO")
    tickers = []
    for path in logs:
        with path.open("w") as log:
            tickers.append(manage("tick", "--loop", "--interval=0.01", env=env, stdout=log, stderr=subprocess.STDOUT))
    try:
        # Both in their loops (a loaded machine may start one long after the other has ticked 600 runs).
        assert wait_for(lambda: all("ticker started" in p.read_text() for p in logs), timeout=60)
        assert wait_for(lambda: Run.objects.count() >= 600, timeout=60), "tickers made too few runs"
    finally:
        for p in tickers:
            p.send_signal(signal.SIGTERM)
        finish(tickers, timeout=30)
    for p, path in zip(tickers, logs, strict=True):
        assert p.returncode == 0, path.read_text()[-2000:]
    slots = Counter(Run.objects.values_list("schedule_id", "scheduled_for"))
    assert max(slots.values()) == 1
    assert len({schedule for schedule, _ in slots}) == 100
    print(f"\n[{connection.vendor}] 2 tickers created {sum(slots.values())} runs, 0 duplicates")
