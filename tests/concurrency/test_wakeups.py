"""Instant wake-ups on PostgreSQL: notified at commit, never for a rolled-back run, only for the queues served.

The senders (enqueue, trigger, tick, a retry due at once, requeue, leases handed
back) are checked with a listening connection of the test's own; the worker's
side with a real worker thread whose poll interval is far longer than the
bound each test waits, so only a wake-up can explain a prompt start.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction

from distsched_app.db import notify
from distsched_app.models import Run, RunState
from distsched_app.services import runs as run_service
from tests.concurrency.procs import received, wait_for
from tests.factories import succeed
from tests.testapp import tasks as t

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

POLL = 30.0  # the worker's poll interval: a start within PROMPT seconds is a wake-up, not a poll
PROMPT = 3.0


@pytest.fixture
def listener():
    listening = notify.Listener(notify.conninfo())
    yield listening
    listening.close()


def test_an_enqueue_notifies_its_queue_at_commit(listener):
    with transaction.atomic():
        t.ft_add.enqueue(1, 2)
        assert listener.wait(0.3) == []  # not before the commit
    assert received(listener) == ["default"]


def test_a_rolled_back_enqueue_notifies_nobody(listener):
    with pytest.raises(RuntimeError), transaction.atomic():
        t.ft_add.enqueue(1, 2)
        raise RuntimeError("rolled back")
    t.ft_urgent.enqueue()  # a committed one afterwards, on another queue: the one notification
    assert received(listener) == ["urgent"]


def test_a_deferred_enqueue_is_not_notified(listener, clock):
    t.ft_add.using(run_after=clock.now() + timedelta(hours=1)).enqueue(1, 2)
    t.ft_urgent.enqueue()
    assert received(listener) == ["urgent"]


def test_trigger_tick_requeue_and_an_immediate_retry_notify(listener, scheduler, make_schedule, clock):
    make_schedule("a", queue="ticked")
    make_schedule("b", queue="triggered")
    scheduler.tick()
    assert received(listener) == ["ticked", "triggered"]
    scheduler.trigger("b")
    assert received(listener) == ["triggered"]
    scheduler.create_schedule(
        name="flaky",
        task_name="tests.fail",
        interval_seconds=3600,
        queue="retries",
        max_attempts=2,
        retry_base_seconds=0,
        retry_max_seconds=0,
    )
    scheduler.tick()
    received(listener)
    scheduler.worker(worker_id="w", queues=["retries"], heartbeat_seconds=3600).run_once()
    assert received(listener) == ["retries"]  # the failure's retry is due at once
    dead = Run.objects.get(schedule__name="a")
    Run.objects.filter(pk=dead.pk).update(state=RunState.DEAD)
    run_service.requeue_run(dead.pk, now=clock.now())
    assert received(listener) == ["ticked"]


def test_notifications_can_be_switched_off(listener, settings):
    settings.DISTSCHED = {"NOTIFY": False}
    t.ft_add.enqueue(1, 2)
    settings.DISTSCHED = {}
    t.ft_urgent.enqueue()
    assert received(listener) == ["urgent"]


@pytest.fixture
def idle_worker(scheduler):
    """A real worker in a thread, idle, listening, polling only every POLL seconds."""
    worker = scheduler.worker(worker_id="sleeper", poll_interval=POLL, heartbeat_seconds=3600)

    def serve() -> None:
        try:
            worker.run(install_signals=False)
        finally:
            connections.close_all()  # this thread's own connection

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert wait_for(worker.wakeup.connected.is_set, timeout=30), "the worker never started listening"
    yield worker
    worker.request_stop()
    thread.join(timeout=60)
    assert not thread.is_alive()


def started_promptly(result) -> float:
    begin = time.monotonic()
    assert wait_for(lambda: Run.objects.get(pk=int(result.id)).state == RunState.SUCCEEDED, timeout=PROMPT), (
        "the idle worker did not wake up"
    )
    return time.monotonic() - begin


def test_an_idle_worker_wakes_at_commit(idle_worker):
    time.sleep(0.2)  # let it settle into its idle wait (not a wait for the scheduler: a wait for nothing)
    elapsed = started_promptly(t.ft_add.enqueue(1, 2))
    assert elapsed < PROMPT < POLL
    assert idle_worker.wakeup.wakeups >= 1


def test_other_queues_and_rollbacks_do_not_wake_it(idle_worker):
    with pytest.raises(RuntimeError), transaction.atomic():
        t.ft_add.enqueue(1, 2)
        raise RuntimeError("rolled back")
    t.ft_urgent.enqueue()  # a queue this worker does not serve
    woken_before = idle_worker.wakeup.wakeups
    started_promptly(t.ft_add.enqueue(3, 4))
    assert idle_worker.wakeup.wakeups == woken_before + 1  # only the last one woke it


def test_a_lost_listening_connection_is_reestablished(idle_worker, caplog):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'distsched-listener' AND pid <> pg_backend_pid()"
        )
    assert wait_for(lambda: not idle_worker.wakeup.connected.is_set(), timeout=30)
    assert wait_for(idle_worker.wakeup.connected.is_set, timeout=30), "it did not reconnect"
    assert any("lost the wake-up connection" in r.getMessage() for r in caplog.records)
    started_promptly(t.ft_add.enqueue(1, 2))


def test_successes_do_not_notify(listener, scheduler, make_schedule, clock):
    make_schedule("s")
    [run] = scheduler.tick()
    received(listener)
    Run.objects.filter(pk=run.pk).update(state=RunState.RUNNING, lease_owner="w", attempts=1, started_at=clock.now())
    assert succeed(run, worker_id="w", attempt=1, now=clock.now())
    assert listener.wait(0.5) == []


class Notifier:
    """Another role's connection notifying the wake-up channel with a served queue's name, in a thread."""

    def __init__(self, every: float) -> None:
        import psycopg

        self.conn = psycopg.connect(notify.conninfo(), autocommit=True)
        self.every = every
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.conn.execute("SELECT pg_notify(%s, 'default')", [notify.CHANNEL])
            self.sent += 1
            if self.every:
                self._stop.wait(self.every)

    def __enter__(self) -> Notifier:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.conn.close()


def test_a_trickle_of_notifications_does_not_stop_lease_recovery(
    idle_worker, scheduler, make_schedule, clock, settings
):
    time.sleep(0.3)  # let it settle into its idle wait (a wait for nothing)
    settings.DISTSCHED = {"NOTIFY": False}  # the run is made abandoned before anyone could claim it
    make_schedule("abandoned")
    with transaction.atomic():
        [run] = scheduler.tick()
        Run.objects.filter(pk=run.pk).update(
            state=RunState.RUNNING, lease_owner="ghost", attempts=1, lease_expires_at=clock.now() - timedelta(seconds=1)
        )
    with Notifier(every=0.2):
        recovered = wait_for(lambda: Run.objects.get(pk=run.pk).state == RunState.SUCCEEDED, timeout=PROMPT + 2)
    assert recovered, "the idle worker never looked for expired leases while notifications kept coming"
    assert Run.objects.get(pk=run.pk).lease_owner == ""


def test_a_notification_storm_is_debounced_and_real_work_still_starts_at_once(idle_worker):
    time.sleep(0.3)
    before = idle_worker.wakeup.wakeups
    with Notifier(every=0) as storm:
        time.sleep(2.0)  # the storm's length (not a wait for the scheduler)
    woken = idle_worker.wakeup.wakeups - before
    assert storm.sent > 200, "the storm was too thin to prove anything"
    assert woken < 30, f"{woken} wake-ups for {storm.sent} empty notifications in 2 s"
    elapsed = started_promptly(t.ft_add.enqueue(1, 2))
    assert elapsed < 1.0


def test_the_listener_is_on_the_runs_database_even_when_djangos_name_is_an_alias(scheduler, monkeypatch):
    """Behind PgBouncer, Django's NAME may be an alias; notifications are per database: ask the server."""
    real = notify.runs_database()
    monkeypatch.setitem(connection.settings_dict, "NAME", "a_pooler_alias")  # not a database of the server
    worker = scheduler.worker(worker_id="aliased", poll_interval=POLL)
    worker.wakeup.start()
    try:
        assert wait_for(worker.wakeup.connected.is_set, timeout=30), "it never listened"
        assert worker.wakeup._database == real
    finally:
        worker.wakeup.stop()


def test_a_listener_on_another_database_warns_and_polls(scheduler, monkeypatch, caplog):
    monkeypatch.setattr(notify, "runs_database", lambda: "the_runs_live_elsewhere")
    real_conninfo = notify.conninfo
    monkeypatch.setattr(notify, "conninfo", lambda dbname=None: real_conninfo())  # e.g. a URL through an alias
    worker = scheduler.worker(worker_id="misdirected", poll_interval=POLL)
    worker.wakeup.start()
    try:
        warned = lambda: any("on another database than the runs" in r.getMessage() for r in caplog.records)  # noqa: E731
        assert wait_for(warned, timeout=30)
        assert not worker.wakeup.connected.is_set()
    finally:
        worker.wakeup.stop()
