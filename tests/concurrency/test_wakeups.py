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
from tests.concurrency.procs import wait_for
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


def received(listening, timeout: float = 2.0) -> list[str]:
    """Everything notified within ``timeout`` (returns early once something came and went quiet)."""
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = listening.wait(0.2 if got else max(0.0, deadline - time.monotonic()))
        if not batch and got:
            break
        got += batch
    return got


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
