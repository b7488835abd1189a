"""SQLite under contention: 4 workers, 2 tickers and a process creating schedules, on one file.

Every writer takes the write lock up front (``BEGIN IMMEDIATE``) and waits for
it (busy timeout), so nobody may see "database is locked", and every run the
creator asked for must finish.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest
from django.db import connection

from distsched_app.models import TERMINAL_STATES, Run, RunState, Schedule
from tests.concurrency.procs import ROOT, LoggedProcesses, child_env, finish, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SCHEDULES = 150

# A separate process writing through the service layer while the others work.
CREATOR = textwrap.dedent(f"""
    import time
    from datetime import timedelta
    import django
    django.setup()
    from distsched_app.clock import system_clock
    from distsched_app.services.schedules import create_schedule, pause_schedule, trigger_schedule

    for i in range({SCHEDULES}):
        now = system_clock.now()
        create_schedule(name=f"c{{i}}", task_name="tests.record", run_at=now + timedelta(seconds=0.3),
                        kwargs={{"sleep": 0.01}}, max_attempts=5, retry_base_seconds=0.1, now=now)
        if i % 25 == 0:
            create_schedule(name=f"i{{i}}", task_name="tests.noop", interval_seconds=1, now=now)
            trigger_schedule(f"c{{i}}", now=now)
        time.sleep(0.01)
    time.sleep(2)
    for i in range(0, {SCHEDULES}, 25):
        pause_schedule(f"i{{i}}", now=system_clock.now())
    print("created", flush=True)
""")


def test_four_workers_two_tickers_and_a_writer_share_one_sqlite_file(tmp_path):
    if connection.vendor != "sqlite":
        pytest.skip("SQLite-only")
    children = LoggedProcesses(tmp_path)
    spawn, logs = children.spawn, children.logs

    procs = {
        f"w{i}": spawn(
            f"w{i}",
            "runworker",
            f"--worker-id=w{i}",
            "--poll-interval=0.05",
            "--heartbeat-seconds=0.5",
            "--lease-seconds=5",
        )
        for i in range(4)
    }
    procs.update({f"t{i}": spawn(f"t{i}", "tick", "--loop", "--interval=0.1") for i in range(2)})
    logs["creator"] = tmp_path / "creator.log"
    with logs["creator"].open("w") as log:
        creator = subprocess.Popen(
            [sys.executable, "-c", CREATOR], cwd=ROOT, env=child_env(), stdout=log, stderr=subprocess.STDOUT
        )
    try:
        [(created, _, _)] = finish([creator], timeout=240)
        drained = wait_for(
            lambda: (
                Schedule.objects.filter(name__startswith="c", next_run_at__isnull=False).count() == 0
                and not Run.objects.exclude(state__in=TERMINAL_STATES).exists()
            ),
            timeout=120,
        )
        alive = {name: p.poll() for name, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        results = finish(list(procs.values()), timeout=60)
    text = {name: path.read_text(errors="replace") for name, path in logs.items()}
    assert created == 0, text["creator"][-3000:]
    assert drained, {s: Run.objects.filter(state=s).count() for s in RunState.values}
    assert all(code is None for code in alive.values()), alive
    for name, (code, _, _) in zip(procs, results, strict=True):
        assert code == 0, f"{name} exited {code}:\n{text[name][-2000:]}"
    for name, body in text.items():
        assert "database is locked" not in body, f"{name}:\n{body[-3000:]}"
        assert "Traceback" not in body, f"{name}:\n{body[-3000:]}"
    once = Run.objects.filter(schedule__name__startswith="c")
    assert once.filter(origin="schedule").count() == SCHEDULES
    assert once.filter(origin="manual").count() == len(range(0, SCHEDULES, 25))
    assert not once.exclude(state=RunState.SUCCEEDED).exists()
    assert Run.objects.filter(schedule__name__startswith="i").exclude(state=RunState.SUCCEEDED).count() == 0
