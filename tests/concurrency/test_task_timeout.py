"""A real worker process and a task that never returns: with a ``timeout`` the worker fails that
attempt at the timeout, goes on with the next run, and still stops at once on SIGTERM (the call it
left running is in a daemon thread)."""

from __future__ import annotations

import json
import signal
import time

import pytest

from distsched_app.models import Run, RunState
from tests.concurrency.procs import child_env, finish, manage, wait_for
from tests.testapp import upstream_tasks as up

pytestmark = pytest.mark.django_db(transaction=True)

BOOT = 90  # seconds a child process may take to start on a loaded machine
OPTIONS = {"tests.testapp.upstream_tasks.sleep_for": {"timeout": 1}}


def test_a_worker_is_not_held_by_a_sync_task_past_its_timeout():
    hung = up.sleep_for.enqueue(3600)  # never returns within the test
    after = up.meaning_of_life.enqueue()
    proc = manage(
        "runworker",
        "--worker-id=timeouts",
        "--concurrency=1",
        "--heartbeat-seconds=0.5",
        "--poll-interval=0.1",
        env=child_env(DISTSCHED_TEST_TASK_OPTIONS=json.dumps(OPTIONS)),
    )
    try:
        assert wait_for(lambda: Run.objects.get(pk=int(after.id)).state == RunState.SUCCEEDED, timeout=BOOT)
        run = Run.objects.get(pk=int(hung.id))
        assert run.state == RunState.DEAD and run.attempts == 1  # the "default" backend: MAX_ATTEMPTS 1
        assert "took longer than its timeout of 1 s" in run.last_error
        hung.refresh()
        assert hung.status.name == "FAILED" and issubclass(hung.errors[0].exception_class, TimeoutError)
    finally:
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        [(code, _, stderr)] = finish([proc], timeout=30)
    assert code == 0, stderr[-2000:]
    assert time.monotonic() - sent < 15  # the sleeping call did not keep the process alive
