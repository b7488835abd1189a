"""Real ``runworker --burst`` processes obey TASK_REQUIRES: a worker without ``--capability gpu``
runs the other runs and leaves the gpu run pending, never claimed; one with it runs it.

``--burst`` exits once nothing it may claim is due, so every wait is a bounded wait for a process
to exit (``finish``), never a sleep for the scheduler.
"""

from __future__ import annotations

import json

import pytest

from distsched_app.models import EventType, Run, RunEvent, RunState, Worker
from distsched_app.services.enqueue import Job, enqueue
from tests.concurrency.procs import child_env, finish, manage
from tests.conftest import T0

pytestmark = pytest.mark.django_db(transaction=True)

BOOT = 120  # seconds a child process may take to start and finish on a loaded machine
REQUIRES = {"tests.echo": ["gpu"]}


def state(run: Run) -> str:
    return Run.objects.values_list("state", flat=True).get(pk=run.pk)


def test_only_a_worker_with_the_capability_runs_the_gpu_run(settings):
    settings.DISTSCHED = {**settings.DISTSCHED, "TASK_REQUIRES": REQUIRES}  # this process's view, for the asserts
    env = child_env(DISTSCHED_TEST_TASK_REQUIRES=json.dumps(REQUIRES))
    gpu_run = enqueue(Job(task_name="tests.echo", priority=100), now=T0).run  # first in line, were it not obeyed
    others = [enqueue(Job(task_name="tests.noop"), now=T0).run for _ in range(3)]

    plain = manage("runworker", "--burst", "--worker-id=plain", "--poll-interval=0.2", env=env)
    [(code, _, stderr)] = finish([plain], timeout=BOOT)
    assert code == 0, stderr[-2000:]
    assert [state(r) for r in others] == [RunState.SUCCEEDED] * 3
    assert state(gpu_run) == RunState.PENDING
    assert not RunEvent.objects.filter(run=gpu_run, event_type=EventType.CLAIMED).exists()
    assert Worker.objects.get(pk="plain").capabilities == []

    capable = manage("runworker", "--burst", "--worker-id=capable", "--capability=gpu", env=env)
    [(code, _, stderr)] = finish([capable], timeout=BOOT)
    assert code == 0, stderr[-2000:]
    assert state(gpu_run) == RunState.SUCCEEDED
    assert Worker.objects.get(pk="capable").capabilities == ["gpu"]
    assert RunEvent.objects.filter(run=gpu_run, event_type=EventType.CLAIMED).get().worker_id == "capable"
