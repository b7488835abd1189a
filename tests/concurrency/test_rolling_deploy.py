"""A rolling deploy with real worker processes, on both databases: an old worker (without the
new task) gives the run it claimed back without spending an attempt and leaves the task's runs
alone from then on, explain and metrics report them while no live worker has the task, and a new
worker then runs each once."""

from __future__ import annotations

import signal

import pytest

from distsched_app.models import EventType, Run, RunEvent, RunState
from distsched_app.registry import registry
from distsched_app.services import explain as explain_service
from distsched_app.services.enqueue import Job, enqueue
from distsched_app.services.stats import read_snapshot
from tests.concurrency.procs import child_env, finish, manage, wait_for
from tests.conftest import T0
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)

BOOT = 120  # seconds a child process may take to start and finish on a loaded machine
RUNS = 4


def enqueue_new_code() -> list[int]:
    """Runs of the task only the new code registers (written as the new web process would)."""
    registry.register("tests.new_code", lambda context: None)
    try:
        return [enqueue(Job(task_name="tests.new_code"), now=T0).pk for _ in range(RUNS)]
    finally:
        registry.unregister("tests.new_code")


def released_by(worker_id: str) -> int:
    return RunEvent.objects.filter(event_type=EventType.RELEASED, worker_id=worker_id).count()


def test_old_workers_give_new_tasks_back_and_new_workers_run_them_once():
    ids = enqueue_new_code()
    old = manage("runworker", "--worker-id=old", "--poll-interval=0.2", "--heartbeat-seconds=1", env=child_env())
    try:
        # It claims one, gives it back, and then leaves the task's runs alone (its claim skips the task).
        assert wait_for(lambda: released_by("old") >= 1, timeout=BOOT), "the old worker gave nothing back"
        assert not wait_for(lambda: released_by("old") > 1, timeout=3), "the old worker claimed the task again"
        runs = list(Run.objects.filter(pk__in=ids))
        assert {(r.state, r.attempts, r.lease_owner) for r in runs} == {(RunState.PENDING, 0, "")}
        # Reported while the only live worker lacks the task.
        from django.utils import timezone

        now = timezone.now()
        kinds = [reason["kind"] for reason in explain_service.explain(runs[0], now=now)["waiting_for"]]
        assert kinds == ["unknown_task"]
        assert read_snapshot(now).runs_with_unknown_task == RUNS

        new = manage("runworker", "--burst", "--worker-id=new", env=child_env(DISTSCHED_TEST_NEW_CODE="1"))
        [(code, _, stderr)] = finish([new], timeout=BOOT)
        assert code == 0, stderr[-2000:]
    finally:
        old.send_signal(signal.SIGTERM)
        [(old_code, _, old_stderr)] = finish([old], timeout=BOOT)
    assert old_code == 0, old_stderr[-2000:]
    runs = list(Run.objects.filter(pk__in=ids))
    assert {(r.state, r.attempts) for r in runs} == {(RunState.SUCCEEDED, 1)}
    executions = list(Execution.objects.values_list("run_id", "attempt", "worker_id"))
    assert sorted(executions) == sorted((run_id, 1, "new") for run_id in ids)  # each once, by the new worker
    assert released_by("old") == 1  # the old worker left the task alone afterwards
    assert not RunEvent.objects.filter(run_id__in=ids, event_type__in=[EventType.FAILED, EventType.LEASE_EXPIRED])
    assert old_stderr.count("task tests.new_code is not registered on this worker") == 1
