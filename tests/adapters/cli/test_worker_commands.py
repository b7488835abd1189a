"""``runworker`` and ``tick`` commands: arguments, exits, one-line errors."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import OperationalError

from distsched_app.models import Run, RunState, Schedule, Worker, WorkerStatus
from tests.concurrency.procs import ROOT, child_env

pytestmark = pytest.mark.django_db


def manage_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--once", "--processes", "2"], "--once executes one run in one process; it takes no --processes"),
        # The children are w...w-1 .. w...w-2: refused before any fork, not by each child.
        (["--processes", "2", "--worker-id", "w" * 199], "worker_id is longer than 200 characters"),
    ],
)
def test_processes_options_that_cannot_work_are_refused_in_one_line(args, message):
    result = manage_run("runworker", *args)
    assert result.returncode == 1
    assert result.stderr.strip() == f"CommandError: {message}"


@pytest.mark.parametrize(
    "args",
    [
        ["runworker", "--lease-seconds", "0"],
        ["runworker", "--lease-seconds", "abc"],
        ["runworker", "--poll-interval", "-1"],
        ["runworker", "--max-runs", "0"],
        ["runworker", "--queues", ","],
        ["runworker", "--once", "--burst"],
        ["runworker", "--processes", "0"],
        ["runworker", "--processes", "65"],
        ["runworker", "--bogus"],
        ["tick", "--interval", "0"],
    ],
)
def test_bad_arguments_give_one_line_and_nonzero_exit(args):
    result = manage_run(*args)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "error" in lines[0] and "Traceback" not in result.stderr


def test_bad_arguments_via_call_command_raise_command_error():
    with pytest.raises(CommandError):
        call_command("runworker", "--lease-seconds", "0")


def test_tick_command_creates_runs(scheduler):
    scheduler.create_schedule(name="c", task_name="tests.noop", interval_seconds=60, start_at="2020-01-01T00:00:00Z")
    out = StringIO()
    call_command("tick", stdout=out)
    assert out.getvalue().strip() == "created 1 run(s)"
    assert Run.objects.count() == 1


def test_runworker_once_executes_one_run_and_exits(scheduler):
    for name in ("a", "b"):
        scheduler.create_schedule(
            name=name, task_name="tests.noop", interval_seconds=60, start_at="2020-01-01T00:00:00Z"
        )
    call_command("tick", stdout=StringIO())
    call_command("runworker", "--once", "--worker-id", "cmd-1")
    assert Run.objects.filter(state=RunState.SUCCEEDED).count() == 1
    assert Worker.objects.get(worker_id="cmd-1").status == WorkerStatus.STOPPED


def test_runworker_once_with_nothing_due_exits_cleanly():
    call_command("runworker", "--once", "--worker-id", "idle")
    assert Worker.objects.get(worker_id="idle").status == WorkerStatus.STOPPED


def test_runworker_burst_with_tick_drains_everything(scheduler):
    for i in range(3):
        scheduler.create_schedule(
            name=f"s{i}", task_name="tests.noop", interval_seconds=3600, start_at="2020-01-01T00:00:00Z"
        )
    call_command("runworker", "--burst", "--with-tick", "--worker-id", "b")
    assert Run.objects.filter(state=RunState.SUCCEEDED).count() == 3
    assert Schedule.objects.filter(next_run_at__isnull=False).count() == 3


def test_runworker_max_runs(scheduler):
    for i in range(3):
        scheduler.create_schedule(
            name=f"s{i}", task_name="tests.noop", interval_seconds=3600, start_at="2020-01-01T00:00:00Z"
        )
    call_command("tick", stdout=StringIO())
    call_command("runworker", "--max-runs", "2", "--worker-id", "m")
    assert Run.objects.filter(state=RunState.SUCCEEDED).count() == 2


@pytest.fixture
def restore_signal_handlers():
    """``tick --loop`` installs SIGTERM/SIGINT handlers in this (the test's) process."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.mark.usefixtures("restore_signal_handlers")
def test_tick_loop_backs_off_on_transient_database_errors_and_keeps_ticking(monkeypatch, caplog):
    from distsched_app.services import leader_chores  # the loop ticks through its leadership

    calls = []

    def flaky_tick(*, now, fence=None):
        calls.append(now)
        if len(calls) <= 2:
            raise OperationalError("database is locked")
        if len(calls) == 4:
            os.kill(os.getpid(), signal.SIGTERM)  # the loop's own stop signal
        return []

    monkeypatch.setattr(leader_chores, "tick", flaky_tick)
    with caplog.at_level(logging.WARNING, logger="distsched"):
        call_command("tick", "--loop", "--interval", "0.01")
    assert len(calls) == 4  # two failures, then it ticked on until told to stop
    warnings = [r for r in caplog.records if r.getMessage() == "database error in tick loop; backing off"]
    assert len(warnings) == 2


@pytest.mark.usefixtures("restore_signal_handlers")
def test_tick_loop_survives_an_unexpected_error_logs_it_and_keeps_ticking(monkeypatch, caplog):
    from distsched_app.services import leader_chores  # the loop ticks through its leadership

    calls = []

    def broken_once(*, now, fence=None):
        calls.append(now)
        if len(calls) == 1:
            raise RuntimeError("a bug in one tick")
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return []

    monkeypatch.setattr(leader_chores, "tick", broken_once)
    with caplog.at_level(logging.WARNING, logger="distsched"):
        call_command("tick", "--loop", "--interval", "0.01")
    assert len(calls) == 3  # the failed tick, then two more until told to stop
    errors = [r for r in caplog.records if r.getMessage() == "tick failed; backing off"]
    assert len(errors) == 1
    assert errors[0].levelno == logging.ERROR
    assert errors[0].exc_info is not None
