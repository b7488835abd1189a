"""Database outages: connections killed under the workers (PostgreSQL), a full disk (SQLite).

The PostgreSQL test never restarts the cluster (others use it): it terminates
the backends of *this test database only*, repeatedly, while real workers and
a ticker are draining runs. They must log, back off, reconnect and finish
everything without a single process dying.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.db.backends.signals import connection_created
from django.db.models import Count

from distsched_app.clock import system_clock
from distsched_app.db import retry as retry_module
from distsched_app.models import TERMINAL_STATES, EventType, Run, RunEvent, RunState, Worker
from distsched_app.services import schedules as schedule_service
from tests.concurrency.procs import LoggedProcesses, finish, wait_for
from tests.conftest import T0
from tests.testapp import tasks as test_tasks

BOOT = 90


def terminate_backends() -> int:
    """Kill every other connection to the current test database (and only to it).

    One statement, so that behind PgBouncer (transaction pooling) ``pg_backend_pid()`` is the
    server connection the statement itself runs on, which must survive.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            [connection.settings_dict["NAME"]],
        )
        (killed,) = cursor.fetchone()
    return killed


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_workers_survive_repeated_backend_terminations(scheduler, clock, tmp_path):
    clock.set(T0 - timedelta(days=1))
    for i in range(150):
        scheduler.create_schedule(
            name=f"o{i}",
            task_name="tests.record",
            run_at=T0,
            max_attempts=50,
            retry_base_seconds=0.1,
            retry_max_seconds=0.5,
            kwargs={"sleep": 0.1},
        )
    clock.set(T0)
    assert len(scheduler.tick()) == 150
    # Something for the ticker to do during the outage too.
    schedule_service.create_schedule(name="ticking", task_name="tests.noop", interval_seconds=1, now=system_clock.now())
    children = LoggedProcesses(tmp_path)
    spawn, logs = children.spawn, children.logs

    procs = {
        f"w{i}": spawn(
            f"w{i}",
            "runworker",
            f"--worker-id=w{i}",
            "--lease-seconds=2",
            "--heartbeat-seconds=0.5",
            "--poll-interval=0.05",
        )
        for i in range(3)
    }
    procs["ticker"] = spawn("ticker", "tick", "--loop", "--interval=0.2")
    rounds = killed = 0
    try:
        assert wait_for(lambda: Run.objects.filter(state=RunState.SUCCEEDED).exists(), timeout=BOOT)
        started = time.monotonic()
        while rounds < 8 or (
            time.monotonic() - started < 20
            and Run.objects.filter(schedule__name__startswith="o").exclude(state__in=TERMINAL_STATES).exists()
        ):
            killed += terminate_backends()
            rounds += 1
            time.sleep(random.uniform(0.3, 0.8))  # the outage cadence, not a synchronisation
        schedule_service.pause_schedule("ticking", now=system_clock.now())
        drained = wait_for(lambda: not Run.objects.exclude(state__in=TERMINAL_STATES).exists(), timeout=120)
        alive = {name: p.poll() for name, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        results = finish(list(procs.values()), timeout=60)
    text = {name: path.read_text(errors="replace") for name, path in logs.items()}
    states = dict(Run.objects.order_by().values_list("state").annotate(n=Count("id")))
    assert drained, f"not drained: {states}\n" + "\n".join(t[-1500:] for t in text.values())
    assert all(code is None for code in alive.values()), f"a process died during the outage: {alive}"
    for name, (code, _, _) in zip(procs, results, strict=True):
        assert code == 0, f"{name} exited {code}:\n{text[name][-2000:]}"
        assert "Traceback" not in text[name], text[name][-3000:]
    assert killed >= rounds, f"only {killed} backends terminated in {rounds} rounds"
    assert Run.objects.filter(schedule__name__startswith="o", state=RunState.SUCCEEDED).count() == 150
    assert Worker.objects.filter(status="stopped").count() == 3
    worker_logs = "".join(text[f"w{i}"] for i in range(3))
    noticed = ["database error", "database unavailable", "heartbeat failed"]
    if os.environ.get("DISTSCHED_REQUIRE_PGBOUNCER"):
        # PgBouncer replaces a killed server connection between transactions, so the workers' own
        # connections may never see the outage; their listeners connect directly and do.
        noticed.append("lost the wake-up connection")
    assert any(line in worker_logs for line in noticed), "no worker noticed the outage"
    print(
        f"\n[postgresql] {killed} backends terminated in {rounds} rounds; 150 runs succeeded; "
        f"{RunEvent.objects.filter(event_type=EventType.LEASE_EXPIRED).count()} lease(s) expired"
    )


class _FastTime:
    """Stands in for the ``time`` module of the retry helper: sleeping advances a fake monotonic clock."""

    def __init__(self) -> None:
        self.offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def sleep(self, seconds: float) -> None:
        self.offset += seconds


@pytest.mark.django_db(transaction=True)
def test_sqlite_disk_full_leaves_the_run_to_lease_expiry_and_the_worker_serving(scheduler, clock, monkeypatch, caplog):
    if connection.vendor != "sqlite":
        pytest.skip("SQLite-only: a full disk simulated with PRAGMA max_page_count")
    full = {"on": False}

    def clamp(connection) -> None:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA max_page_count = 1")  # clamps to the current size: no growth

    def on_connect(sender, connection, **kwargs):
        if full["on"] and connection.vendor == "sqlite":
            clamp(connection)

    def hook(context):
        if context.attempt == 1:  # the disk fills up while the task runs
            full["on"] = True
            with connection.cursor() as cursor:
                cursor.execute("VACUUM")  # no free pages left for the result to reuse
            clamp(connection)
        return "x" * 50_000  # a result that needs new pages

    # Leave free pages in the file (as earlier deletions would): the hook must not let the result reuse them.
    scheduler.create_schedule(name="freed", task_name="tests.noop", interval_seconds=60, kwargs={"b": "y" * 60_000})
    scheduler.delete_schedule("freed")
    monkeypatch.setattr(retry_module, "time", _FastTime())  # the retries back off without real waiting
    test_tasks.HOOKS["fill"] = hook
    scheduler.create_schedule(
        name="full", task_name="tests.hook", interval_seconds=3600, kwargs={"name": "fill"}, max_attempts=3
    )
    [run] = scheduler.tick()
    worker = scheduler.worker(worker_id="w", lease_seconds=30, heartbeat_seconds=3600)
    connection_created.connect(on_connect)
    try:
        with caplog.at_level(logging.WARNING, logger="distsched"):
            first = worker.run_once()
    finally:
        full["on"] = False
        connection_created.disconnect(on_connect)
        connection.close()  # a fresh connection has no page limit
    assert first.state is None  # the outcome could not be recorded
    messages = [(r.getMessage(), r.distsched.get("error", "")) for r in caplog.records]
    assert any("database or disk is full" in error for _, error in messages), messages
    assert any(msg.startswith("giving up recording outcome") for msg, _ in messages), messages
    run.refresh_from_db()
    assert (run.state, run.attempts) == (RunState.RUNNING, 1)  # not lost: held by an expiring lease

    # Space is back; the lease runs out; the same worker (still serving) recovers the run.
    clock.advance(seconds=31)
    second = worker.run_once()
    assert second.state == RunState.SUCCEEDED
    run.refresh_from_db()
    assert (run.state, run.attempts) == (RunState.SUCCEEDED, 2)
    kinds = list(RunEvent.objects.filter(run=run).values_list("event_type", flat=True))
    assert EventType.LEASE_EXPIRED in kinds


@pytest.mark.django_db(transaction=True)
def test_a_claim_interrupted_before_commit_leaves_the_run_claimable(scheduler, monkeypatch):
    """The claim is one transaction: dying between its UPDATE and its commit changes nothing."""
    from distsched_app.db import bulk
    from distsched_app.services import claiming

    scheduler.create_schedule(name="c", task_name="tests.noop", interval_seconds=3600)
    [run] = scheduler.tick()

    def crash_after(write):
        def written_then_dead(*args, **kwargs):
            write(*args, **kwargs)  # the runs marked and the events appended, in the transaction...
            raise KeyboardInterrupt("process dies inside the claim transaction")  # ...never committed

        return written_then_dead

    with monkeypatch.context() as patch:
        # The claim's last write (PostgreSQL: one statement; SQLite: the events with the UPDATE),
        # its COMMIT not sent with it, so that the process can die in between.
        patch.setattr(bulk, "commits_early", lambda: False)
        patch.setattr(claiming.claims, "write_claim", crash_after(claiming.claims.write_claim))
        patch.setattr(claiming.events, "record_many", crash_after(claiming.events.record_many))
        with pytest.raises(KeyboardInterrupt):
            claiming.claim_next_run(worker_id="doomed", queues=None, lease_seconds=30, now=scheduler.now())
    run.refresh_from_db()
    assert (run.state, run.attempts, run.lease_owner) == (RunState.PENDING, 0, "")
    assert list(RunEvent.objects.filter(run=run).values_list("event_type", flat=True)) == [EventType.CREATED]
    # The next worker simply claims it.
    worker = scheduler.worker(worker_id="next", heartbeat_seconds=3600)
    assert worker.run_once().state == RunState.SUCCEEDED
