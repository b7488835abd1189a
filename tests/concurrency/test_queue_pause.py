"""A real ``runworker`` process leaves a paused queue's runs alone and runs them after the resume.

On PostgreSQL the worker polls only every 30 s, so the run starting within a
few seconds of the resume is the resume's notification waking it; on SQLite
it polls every 0.2 s. Every wait is a bounded poll of the database.
"""

from __future__ import annotations

import signal

import pytest

from distsched_app.models import EventType, Run, RunEvent, RunState
from distsched_app.services import queues
from distsched_app.services.enqueue import Job, enqueue
from tests.concurrency.procs import finish, manage, wait_for
from tests.conftest import T0, is_postgres

pytestmark = pytest.mark.django_db(transaction=True)

BOOT = 90  # seconds a child process may take to start on a loaded machine
WOKEN = 15.0  # PostgreSQL: well under the 30 s poll, so only the notification explains a start this soon


def state(run: Run) -> str:
    return Run.objects.values_list("state", flat=True).get(pk=run.pk)


def due(queue: str, priority: int = 0) -> Run:
    return enqueue(Job(task_name="tests.noop", queue=queue, priority=priority), now=T0).run  # T0: the real past


def test_a_worker_does_not_run_a_paused_queues_run_and_runs_it_after_the_resume(clock):
    held = due("held", priority=100)  # first in line of every claim, were the pause not obeyed
    queues.pause_queue("held", now=clock.now(), by="code:tests", reason="test")
    first = due("default")
    poll = "30" if is_postgres() else "0.2"
    proc = manage("runworker", "--worker-id=pauser", "--queues=held,default", f"--poll-interval={poll}")
    try:
        assert wait_for(lambda: state(first) == RunState.SUCCEEDED, timeout=BOOT), "the worker never ran a run"
        # Another claim after the first: on PostgreSQL the enqueue's notification wakes it.
        second = due("default")
        assert wait_for(lambda: state(second) == RunState.SUCCEEDED, timeout=WOKEN if is_postgres() else 30)
        assert state(held) == RunState.PENDING
        assert not RunEvent.objects.filter(run=held, event_type=EventType.CLAIMED).exists()

        queues.resume_queue("held", now=clock.now(), by="code:tests")
        assert wait_for(lambda: state(held) == RunState.SUCCEEDED, timeout=WOKEN if is_postgres() else 30), (
            "the resumed queue's run did not run (on PostgreSQL: the resume did not wake the idle worker)"
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        [(code, _, stderr)] = finish([proc], timeout=60)
    assert code == 0, stderr[-2000:]
