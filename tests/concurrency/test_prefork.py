"""``runworker --processes K``: one Django set-up, K forked workers under one supervisor."""

from __future__ import annotations

import os
import signal
from collections import Counter
from datetime import timedelta

import pytest

from distsched_app.models import EventType, Run, RunEvent, RunState, Worker, WorkerStatus
from tests.concurrency.procs import finish, manage, wait_for
from tests.conftest import T0
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)

BOOT = 90  # seconds the processes may take to start on a loaded machine


def due_runs(scheduler, clock, count: int, **kwargs) -> None:
    clock.set(T0 - timedelta(days=1))
    for i in range(count):
        scheduler.create_schedule(name=f"r{i}", task_name="tests.record", run_at=T0, max_attempts=1, kwargs=kwargs)
    clock.set(T0)
    assert len(scheduler.tick()) == count


def rows(*worker_ids: str) -> dict[str, tuple[str, int]]:
    found = Worker.objects.filter(worker_id__in=worker_ids).values_list("worker_id", "status", "pid")
    return {worker_id: (status, pid) for worker_id, status, pid in found}


def all_active(*worker_ids: str) -> bool:
    found = rows(*worker_ids)
    return len(found) == len(worker_ids) and all(s == WorkerStatus.ACTIVE for s, _ in found.values())


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_two_processes_drain_runs_with_both_children_claiming(scheduler, clock):
    due_runs(scheduler, clock, 300, sleep=0.01)  # ~3 s of work: both children are up long before it is done
    proc = manage("runworker", "--processes=2", "--burst", "--worker-id=pf", "--poll-interval=0.05")
    [(code, _, stderr)] = finish([proc], timeout=240)
    assert code == 0, stderr[-2000:]
    assert Run.objects.filter(state=RunState.SUCCEEDED).count() == 300
    executions = Counter(Execution.objects.values_list("run_id", flat=True))
    assert len(executions) == 300 and max(executions.values()) == 1, "a run was executed twice"
    claimed_by = Counter(RunEvent.objects.filter(event_type=EventType.CLAIMED).values_list("worker_id", flat=True))
    assert set(claimed_by) == {"pf-1", "pf-2"}, claimed_by
    assert sum(claimed_by.values()) == 300
    children = rows("pf-1", "pf-2")
    assert {status for status, _ in children.values()} == {WorkerStatus.STOPPED}
    pids = {pid for _, pid in children.values()}
    assert len(pids) == 2 and proc.pid not in pids, "each child is its own forked process"


def test_sigterm_to_the_supervisor_finishes_the_run_in_hand_and_stops_every_child(scheduler, clock):
    due_runs(scheduler, clock, 1, sleep=2)
    proc = manage("runworker", "--processes=2", "--worker-id=sv", "--poll-interval=0.1", "--heartbeat-seconds=0.5")
    assert wait_for(lambda: all_active("sv-1", "sv-2"), timeout=BOOT), proc.stderr
    assert wait_for(Execution.objects.exists, timeout=BOOT), "the task never started"
    proc.send_signal(signal.SIGTERM)
    [(code, _, stderr)] = finish([proc], timeout=60)
    assert code == 0, stderr[-2000:]
    run = Run.objects.get()
    assert (run.state, run.attempts) == (RunState.SUCCEEDED, 1), "the run in hand was finished, not abandoned"
    children = rows("sv-1", "sv-2")
    assert {status for status, _ in children.values()} == {WorkerStatus.STOPPED}
    assert all(gone(pid) for _, pid in children.values()), "a child outlived its supervisor"


def test_a_child_that_dies_is_restarted_under_the_same_id():
    proc = manage("runworker", "--processes=2", "--worker-id=rs", "--poll-interval=0.1", "--heartbeat-seconds=0.5")
    assert wait_for(lambda: all_active("rs-1", "rs-2"), timeout=BOOT)
    _, killed = rows("rs-1")["rs-1"]
    os.kill(killed, signal.SIGKILL)
    # The supervisor forks a new rs-1 (after a short back-off: it died young), which registers with its own pid.
    assert wait_for(lambda: all_active("rs-1", "rs-2") and rows("rs-1")["rs-1"][1] != killed, timeout=BOOT)
    proc.send_signal(signal.SIGTERM)
    [(code, _, stderr)] = finish([proc], timeout=60)
    assert code == 0, stderr[-2000:]
    assert "worker process died; restarting it" in stderr
    assert {status for status, _ in rows("rs-1", "rs-2").values()} == {WorkerStatus.STOPPED}
