"""A zombie worker: frozen (SIGSTOP) past its lease, then resumed after another worker took over."""

from __future__ import annotations

import signal

import pytest

from distsched_app.models import EventType, Run, RunEvent, RunState, Worker
from tests.concurrency.procs import finish, manage, wait_for
from tests.concurrency.test_shutdown import BOOT, due_runs
from tests.testapp.models import Execution

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_frozen_worker_resumes_as_a_zombie_and_its_late_success_is_discarded(scheduler, clock):
    [run] = due_runs(scheduler, clock, 1, "tests.record_slow_first", kwargs={"first_sleep": 3}, max_attempts=5)
    args = ("--lease-seconds=2", "--heartbeat-seconds=0.5", "--poll-interval=0.05")
    zombie = manage("runworker", "--worker-id=zombie", *args)
    rescuer = None
    try:
        assert wait_for(Execution.objects.exists, timeout=BOOT), "the task never started"
        zombie.send_signal(signal.SIGSTOP)  # a long GC pause, a frozen VM, a partition: no heartbeat
        rescuer = manage("runworker", "--worker-id=rescuer", *args)
        assert wait_for(lambda: Run.objects.get(pk=run.pk).state == RunState.SUCCEEDED, timeout=BOOT)
        zombie.send_signal(signal.SIGCONT)  # it wakes up, finishes attempt 1 and tries to record it
        assert wait_for(lambda: RunEvent.objects.filter(run=run, event_type=EventType.LEASE_LOST).exists(), timeout=60)
        # The zombie is still a healthy worker afterwards.
        assert zombie.poll() is None
        assert wait_for(lambda: Worker.objects.get(worker_id="zombie").status == "active", timeout=10)
    finally:
        zombie.send_signal(signal.SIGCONT)
        procs = [p for p in (zombie, rescuer) if p is not None]
        for p in procs:
            p.send_signal(signal.SIGTERM)
        results = finish(procs, timeout=60)
    for code, _, stderr in results:
        assert code == 0, stderr[-2000:]
    run.refresh_from_db()
    assert (run.state, run.attempts, run.result) == (RunState.SUCCEEDED, 2, None)
    events = list(RunEvent.objects.filter(run=run).order_by("id").values_list("event_type", "worker_id", "attempt"))
    assert (EventType.LEASE_EXPIRED, "zombie", 1) in events
    assert (EventType.SUCCEEDED, "rescuer", 2) in events
    assert (EventType.LEASE_LOST, "zombie", 1) in events
    assert [e for e in events if e[0] == EventType.SUCCEEDED] == [(EventType.SUCCEEDED, "rescuer", 2)]
    assert sorted(Execution.objects.values_list("attempt", "worker_id")) == [(1, "zombie"), (2, "rescuer")]
