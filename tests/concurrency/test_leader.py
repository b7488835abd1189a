"""Real ticker processes elect one leader; failover after kill -9; a paused ex-leader is fenced.

Each ticker is ``manage.py tick --loop`` with a 3 s leader lease, logging at INFO to its own
file, so the test reads who became leader, who stepped down and who ticked.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection

from distsched_app.clock import SystemClock
from distsched_app.models import Leader, Run
from distsched_app.services import leader
from distsched_app.services import schedules as schedule_service
from tests.concurrency.procs import child_env, finish, manage, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LEASE = 3.0


class Tickers:
    def __init__(self, directory: Path, n: int) -> None:
        self.logs = [directory / f"ticker{i}.log" for i in range(n)]
        env = child_env(DISTSCHED_TEST_LEADER_LEASE_SECONDS=str(LEASE), DISTSCHED_LOG_LEVEL="INFO")
        self.procs: list[subprocess.Popen] = []
        for path in self.logs:
            with path.open("w") as log:
                self.procs.append(
                    manage("tick", "--loop", "--interval=0.2", env=env, stdout=log, stderr=subprocess.STDOUT)
                )

    def log(self, pid: int) -> str:
        return self.logs[[p.pid for p in self.procs].index(pid)].read_text()

    def count(self, text: str) -> int:
        return sum(path.read_text().count(text) for path in self.logs)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)  # a stopped one must be able to handle SIGTERM
                p.send_signal(signal.SIGTERM)
        finish(self.procs, timeout=60)

    def tails(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in self.logs)


def every_second(name: str) -> None:
    schedule_service.create_schedule(
        name=name, task_name="tests.noop", interval_seconds=1, catch_up="all", now=SystemClock().now()
    )


def current_leader_pid() -> int | None:
    return leader.status().pid


def assert_slots_contiguous(name: str) -> list:
    """Every one-second slot from the first to the last has exactly one run: no gap, no duplicate."""
    slots = list(
        Run.objects.filter(schedule__name=name).order_by("scheduled_for").values_list("scheduled_for", flat=True)
    )
    assert len(slots) == len(set(slots)), "a slot has two runs"
    gaps = [b - a for a, b in itertools.pairwise(slots) if b - a != timedelta(seconds=1)]
    assert not gaps, f"the schedule skipped slots: {gaps[:5]}"
    return slots


def test_three_tickers_one_leader_and_failover_after_kill_9(tmp_path):
    every_second("beat")
    tickers = Tickers(tmp_path, 3)
    try:
        assert wait_for(lambda: current_leader_pid() is not None, timeout=60), tickers.tails()
        first = current_leader_pid()
        assert first in [p.pid for p in tickers.procs]
        assert wait_for(lambda: Run.objects.filter(schedule__name="beat").count() >= 5, timeout=60), tickers.tails()
        assert tickers.count("became leader") == 1, tickers.tails()
        assert "tick created runs" in tickers.log(first)
        assert all("tick created runs" not in tickers.log(p.pid) for p in tickers.procs if p.pid != first)

        killed_at = time.monotonic()
        os.kill(first, signal.SIGKILL)
        before = set(Run.objects.values_list("pk", flat=True))
        assert wait_for(lambda: current_leader_pid() not in (None, first), timeout=LEASE + 30), tickers.tails()
        new_leader_after = time.monotonic() - killed_at
        assert wait_for(lambda: Run.objects.exclude(pk__in=before).exists(), timeout=30), tickers.tails()
        first_tick_after = time.monotonic() - killed_at
        print(
            f"\n[{connection.vendor}] kill -9 of the leader: new leader after {new_leader_after:.1f} s, "
            f"its first tick after {first_tick_after:.1f} s (lease {LEASE:.0f} s)"
        )
        assert new_leader_after <= LEASE + 10  # the lease, a standby's try (1 s), a loaded machine's slack
        count = Run.objects.filter(schedule__name="beat").count()
        assert wait_for(lambda: Run.objects.filter(schedule__name="beat").count() >= count + 3, timeout=30)
        assert tickers.count("became leader") == 2, tickers.tails()
        assert Leader.objects.get().term == 2
    finally:
        tickers.stop()
    assert_slots_contiguous("beat")


def test_a_leader_paused_past_its_lease_is_replaced_and_writes_nothing_when_resumed(tmp_path):
    every_second("beat")
    tickers = Tickers(tmp_path, 2)
    try:
        assert wait_for(lambda: current_leader_pid() is not None, timeout=60), tickers.tails()
        old = current_leader_pid()
        assert old is not None
        assert wait_for(lambda: Run.objects.count() >= 3, timeout=60), tickers.tails()
        os.kill(old, signal.SIGSTOP)
        assert wait_for(lambda: current_leader_pid() not in (None, old), timeout=LEASE + 30), tickers.tails()
        count = Run.objects.count()
        assert wait_for(lambda: Run.objects.count() >= count + 2, timeout=30), tickers.tails()
        paused_log = len(tickers.log(old))
        os.kill(old, signal.SIGCONT)
        assert wait_for(lambda: "stepped down" in tickers.log(old)[paused_log:], timeout=30), tickers.tails()
        count = Run.objects.count()
        assert wait_for(lambda: Run.objects.count() >= count + 3, timeout=30), tickers.tails()  # the new one ticks on
        resumed = tickers.log(old)[paused_log:]
        assert "tick created runs" not in resumed, resumed  # fenced: the ex-leader wrote nothing
        assert "became leader" not in resumed
        assert current_leader_pid() != old
    finally:
        tickers.stop()
    assert_slots_contiguous("beat")


def test_a_worker_with_tick_and_a_ticker_elect_one_leader_and_a_clean_stop_hands_over_at_once(tmp_path):
    every_second("beat")
    env = child_env(DISTSCHED_TEST_LEADER_LEASE_SECONDS="30", DISTSCHED_LOG_LEVEL="INFO")
    logs = [tmp_path / "worker.log", tmp_path / "ticker.log"]
    commands = [("runworker", "--with-tick", "--poll-interval=0.2"), ("tick", "--loop", "--interval=0.2")]
    procs = []
    for path, command in zip(logs, commands, strict=True):
        with path.open("w") as log:
            procs.append(manage(*command, env=env, stdout=log, stderr=subprocess.STDOUT))
    tails = lambda: "\n".join(p.read_text()[-1500:] for p in logs)  # noqa: E731
    try:
        assert wait_for(lambda: current_leader_pid() is not None, timeout=60), tails()
        first = current_leader_pid()
        assert first in [p.pid for p in procs]
        count = Run.objects.count()
        assert wait_for(lambda: Run.objects.count() >= count + 2, timeout=30), tails()
        assert sum(p.read_text().count("became leader") for p in logs) == 1, tails()
        stopped = next(p for p in procs if p.pid == first)
        stopped_at = time.monotonic()
        stopped.send_signal(signal.SIGTERM)  # gives the lease up: no 30 s wait for it to expire
        assert wait_for(lambda: current_leader_pid() not in (None, first), timeout=20), tails()
        print(f"\n[{connection.vendor}] clean stop of the leader: handed over in {time.monotonic() - stopped_at:.1f} s")
        assert time.monotonic() - stopped_at < 20  # far less than the 30 s lease
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        finish(procs, timeout=60)
    assert_slots_contiguous("beat")


@pytest.mark.postgres
def test_a_standby_costs_at_most_about_one_transaction_a_second(tmp_path):
    """Two standbys against a lease the test holds: the database's commit counter, per standby per second."""
    held = leader.DatabaseStore().acquire(holder="the-test", pid=os.getpid(), host="test", lease_seconds=3600)
    assert held is not None
    tickers = Tickers(tmp_path, 2)
    try:
        assert wait_for(lambda: tickers.count("ticker started") == 2, timeout=60), tickers.tails()
        time.sleep(3)  # let their start-up transactions (checks, first queries) pass
        start, t0 = _commits(), time.monotonic()
        time.sleep(10)  # ten seconds of a standby's attempts to take the lease
        end, t1 = _commits(), time.monotonic()
    finally:
        tickers.stop()
    per_standby = (end - start) / (t1 - t0) / 2
    print(f"\n[postgresql] a standby ticker: {per_standby:.2f} transactions/s")
    assert per_standby <= 1.5
    assert tickers.count("became leader") == 0


def _commits() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])
