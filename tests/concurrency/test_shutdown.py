"""Graceful shutdown of real worker processes: SIGTERM finishes the run, a second signal leaves at once."""

from __future__ import annotations

import signal
import time
from datetime import timedelta

import pytest

from distsched_app.models import EventType, Run, RunEvent, RunState, Worker, WorkerStatus
from tests.concurrency.procs import finish, manage, wait_for
from tests.conftest import T0
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)

BOOT = 90  # seconds a child process may take to start on a loaded machine


def due_runs(scheduler, clock, count: int, task_name: str, **options) -> list[Run]:
    """``count`` runs already due for real-time workers (T0 is in the real past)."""
    clock.set(T0 - timedelta(days=1))
    for i in range(count):
        scheduler.create_schedule(name=f"due-{i}", task_name=task_name, run_at=T0, **options)
    clock.set(T0)
    return sorted(scheduler.tick(), key=lambda r: r.pk)


def status(worker_id: str) -> str | None:
    return Worker.objects.filter(worker_id=worker_id).values_list("status", flat=True).first()


def worker(worker_id: str, lease: float = 10, *extra: str):
    return manage(
        "runworker",
        f"--worker-id={worker_id}",
        f"--lease-seconds={lease:g}",
        "--heartbeat-seconds=0.5",
        "--poll-interval=0.1",
        *extra,
    )


def history(run: Run) -> list[tuple[str, str, int]]:
    return list(RunEvent.objects.filter(run=run).order_by("id").values_list("event_type", "worker_id", "attempt"))


def test_sigterm_to_an_idle_worker_stops_it_cleanly():
    proc = worker("idle")
    assert wait_for(lambda: status("idle") == WorkerStatus.ACTIVE, timeout=BOOT)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    [(code, _, stderr)] = finish([proc], timeout=30)
    assert code == 0, stderr[-2000:]
    assert time.monotonic() - sent < 10
    assert status("idle") == WorkerStatus.STOPPED


def test_sigterm_to_a_busy_worker_finishes_the_run_then_stops(scheduler, clock):
    lease = 10
    due_runs(scheduler, clock, 2, "tests.record", kwargs={"sleep": 3})
    proc = worker("busy", lease)
    assert wait_for(Execution.objects.exists, timeout=BOOT), "the task never started"
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    # The heartbeat publishes the draining state while the task finishes.
    saw_stopping = wait_for(lambda: status("busy") == WorkerStatus.STOPPING, timeout=lease, interval=0.05)
    [(code, _, stderr)] = finish([proc], timeout=lease + 20)
    took = time.monotonic() - sent
    assert code == 0, stderr[-2000:]
    assert took < lease, f"shutdown took {took:.1f}s, longer than the lease"
    assert saw_stopping
    assert status("busy") == WorkerStatus.STOPPED
    [execution] = Execution.objects.all()
    executed = Run.objects.get(pk=execution.run_id)
    assert (executed.state, executed.attempts) == (RunState.SUCCEEDED, 1)
    # It claimed nothing after the signal.
    other = Run.objects.exclude(pk=executed.pk).get()
    assert (other.state, other.attempts) == (RunState.PENDING, 0)


def test_sigterm_to_a_once_worker_finishes_its_run(scheduler, clock):
    [run] = due_runs(scheduler, clock, 1, "tests.record", kwargs={"sleep": 3})
    proc = worker("once", 10, "--once")
    assert wait_for(Execution.objects.exists, timeout=BOOT), "the task never started"
    proc.send_signal(signal.SIGTERM)
    [(code, _, stderr)] = finish([proc], timeout=30)
    assert code == 0, stderr[-2000:]
    run.refresh_from_db()
    assert (run.state, run.attempts) == (RunState.SUCCEEDED, 1)
    assert status("once") == WorkerStatus.STOPPED


@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGTERM])
def test_second_signal_exits_at_once_and_lease_expiry_recovers_the_run(scheduler, clock, second):
    lease = 2
    [run] = due_runs(scheduler, clock, 1, "tests.record_slow_first", kwargs={"first_sleep": 60}, max_attempts=3)
    first = worker("first", lease)
    assert wait_for(Execution.objects.exists, timeout=BOOT), "the task never started"
    first.send_signal(signal.SIGTERM)
    assert wait_for(lambda: status("first") == WorkerStatus.STOPPING, timeout=10, interval=0.05)
    sent = time.monotonic()
    first.send_signal(second)
    [(code, _, stderr)] = finish([first], timeout=30)
    assert time.monotonic() - sent < 5, "the second signal did not exit at once"
    assert code != 0
    assert "exiting now" in stderr
    run.refresh_from_db()
    assert (run.state, run.lease_owner, run.attempts) == (RunState.RUNNING, "first", 1)

    # Another worker takes the run over once the abandoned lease expires.
    rescuer = worker("rescuer", lease)
    try:
        assert wait_for(lambda: Run.objects.get(pk=run.pk).state == RunState.SUCCEEDED, timeout=BOOT)
    finally:
        rescuer.send_signal(signal.SIGTERM)
        [(code, _, stderr)] = finish([rescuer], timeout=30)
    assert code == 0, stderr[-2000:]
    events = history(run)
    assert (EventType.LEASE_EXPIRED, "first", 1) in events
    assert events[-1] == (EventType.SUCCEEDED, "rescuer", 2)
    assert sorted(Execution.objects.values_list("attempt", "worker_id")) == [(1, "first"), (2, "rescuer")]
