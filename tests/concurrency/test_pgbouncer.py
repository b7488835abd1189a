"""Behind PgBouncer in transaction pooling mode (CI's PgBouncer leg): LISTEN cannot work there.

Django's connections go through the pooler; ``DISTSCHED["LISTEN_DATABASE_URL"]``
points the listener at the server directly. Without it, a worker must see that
notifications never reach it, say so once and poll; with it, an enqueue made
through the pooler wakes an idle worker at once.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
from django.db import connection, connections

from distsched_app.db import notify
from distsched_app.models import Run, RunState
from tests.concurrency.procs import wait_for
from tests.testapp import tasks as t

pytestmark = [pytest.mark.pgbouncer, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

WARNING = "notifications do not reach this connection"


def through_the_pooler(settings) -> str:
    """The listener's connection string as it would be without LISTEN_DATABASE_URL: Django's, via PgBouncer."""
    settings.DISTSCHED = {k: v for k, v in settings.DISTSCHED.items() if k != "LISTEN_DATABASE_URL"}
    return notify.conninfo()


def test_the_suite_really_runs_through_pgbouncer():
    with connection.cursor() as cursor:
        cursor.execute("SELECT inet_server_port()")
        (server_port,) = cursor.fetchone()
    assert str(connection.settings_dict["PORT"]) != str(server_port)  # the client's port is not the server's


def test_a_listener_through_the_pooler_is_detected_and_hears_nothing(settings):
    listening = notify.Listener(through_the_pooler(settings))
    try:
        assert listening.behind_a_pooler()
        assert not listening.probe()
    finally:
        listening.close()


def test_a_direct_listener_passes_the_probe(settings):
    assert settings.DISTSCHED.get("LISTEN_DATABASE_URL")  # set by the leg: the server itself, not the pooler
    listening = notify.Listener(notify.conninfo())
    try:
        assert not listening.behind_a_pooler()
        assert listening.probe()
    finally:
        listening.close()


def serve(worker) -> threading.Thread:
    def run() -> None:
        try:
            worker.run(install_signals=False)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def stop(worker, thread: threading.Thread) -> None:
    worker.request_stop()
    thread.join(timeout=60)
    assert not thread.is_alive()


def test_without_a_direct_url_the_worker_warns_once_and_polls(scheduler, settings, caplog):
    through_the_pooler(settings)
    caplog.set_level(logging.WARNING)
    worker = scheduler.worker(worker_id="pooled", poll_interval=0.5, heartbeat_seconds=3600)
    thread = serve(worker)
    try:
        assert wait_for(lambda: any(WARNING in r.getMessage() for r in caplog.records), timeout=30)
        result = t.ft_add.enqueue(2, 3)
        assert wait_for(lambda: Run.objects.get(pk=int(result.id)).state == RunState.SUCCEEDED, timeout=30)
        assert not worker.wakeup.connected.is_set() and worker.wakeup.wakeups == 0  # it polled
    finally:
        stop(worker, thread)
    assert sum(WARNING in r.getMessage() for r in caplog.records) == 1


def test_with_a_direct_url_an_enqueue_through_the_pooler_wakes_an_idle_worker(scheduler):
    worker = scheduler.worker(worker_id="direct", poll_interval=30.0, heartbeat_seconds=3600)
    thread = serve(worker)
    try:
        assert wait_for(worker.wakeup.connected.is_set, timeout=30), "the listener never connected"
        time.sleep(0.2)  # let it settle into its idle wait (a wait for nothing, not for the scheduler)
        begin = time.monotonic()
        result = t.ft_add.enqueue(2, 3)  # through PgBouncer
        assert wait_for(lambda: Run.objects.get(pk=int(result.id)).state == RunState.SUCCEEDED, timeout=3.0)
        assert time.monotonic() - begin < 3.0 < 30.0 and worker.wakeup.wakeups >= 1
    finally:
        stop(worker, thread)
