"""What a worker's log says: its start line names where and how it serves; a failed run's
line names the exception, in distsched's formatter and in Python's default one alike."""

from __future__ import annotations

import logging
import os
from io import StringIO

import pytest
from django.core.management import call_command

from distsched_app.db import server
from distsched_app.logutils import DistschedFormatter
from distsched_app.registry import registry

pytestmark = pytest.mark.django_db


def started_line(caplog) -> logging.LogRecord:
    [started] = [r for r in caplog.records if r.getMessage() == "worker started"]
    return started


def test_start_line_names_database_queues_concurrency_tick_mode_and_tasks(scheduler, caplog):
    worker = scheduler.worker(
        worker_id="w-start", queues=["default", "emails"], concurrency=4, with_tick=True, heartbeat_seconds=3600
    )
    with caplog.at_level(logging.INFO, logger="distsched"):
        worker.register()
    fields = started_line(caplog).distsched
    assert fields["database"] == server.describe()
    assert (fields["queues"], fields["concurrency"], fields["tick"]) == ("default,emails", 4, "with-tick")
    assert fields["tasks"] == len(registry.names()) and fields["tasks"] > 0
    assert (fields["worker_id"], fields["pid"], fields["capabilities"]) == ("w-start", os.getpid(), "-")


def test_runworker_start_line_without_tick(caplog):
    with caplog.at_level(logging.INFO, logger="distsched"):
        call_command("runworker", "--once", "--worker-id", "cmd", "--queues", "q1", stdout=StringIO())
    fields = started_line(caplog).distsched
    assert (fields["tick"], fields["queues"], fields["concurrency"]) == ("no", "q1", 1)
    assert fields["database"].startswith(("sqlite:///", "postgresql://"))


@pytest.fixture
def failed_line(scheduler, caplog) -> logging.LogRecord:
    scheduler.create_schedule(name="bad", task_name="tests.fail", interval_seconds=60, kwargs={"message": "disk full"})
    scheduler.tick()
    worker = scheduler.worker(worker_id="w1", heartbeat_seconds=3600)
    with caplog.at_level(logging.INFO, logger="distsched"):
        worker.run_once()
    [line] = [r for r in caplog.records if r.getMessage().startswith("run finished")]
    return line


def test_failed_run_line_carries_the_exception_in_pythons_default_format(failed_line):
    assert failed_line.levelno == logging.WARNING
    # What a handler without distsched's formatter prints: Python's default and basicConfig's.
    assert logging.Formatter().format(failed_line) == "run finished (retrying): ValueError: disk full"
    assert logging.Formatter(logging.BASIC_FORMAT).format(failed_line) == (
        "WARNING:distsched:run finished (retrying): ValueError: disk full"
    )


def test_failed_run_line_in_distsched_formatter_has_the_fields_too(failed_line, settings):
    settings.DISTSCHED = {"LOG_FORMAT": "text"}
    text = DistschedFormatter().format(failed_line)
    assert " WARNING run finished (retrying): ValueError: disk full worker_id=w1 " in text
    assert 'error="ValueError: disk full"' in text and "error_class=builtins.ValueError" in text
    assert "state=retrying" in text and "task=tests.fail" in text


def test_a_succeeded_run_line_is_unchanged(scheduler, caplog):
    scheduler.create_schedule(name="ok", task_name="tests.noop", interval_seconds=60)
    scheduler.tick()
    with caplog.at_level(logging.INFO, logger="distsched"):
        scheduler.worker(worker_id="w1", heartbeat_seconds=3600).run_once()
    [line] = [r for r in caplog.records if r.getMessage().startswith("run finished")]
    assert line.getMessage() == "run finished" and "error" not in line.distsched
