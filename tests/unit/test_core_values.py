"""Pure building blocks: clock, registry, context, settings accessor, log formatters."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta, timezone

import pytest

from distsched_app.clock import FakeClock, SystemClock
from distsched_app.conf import conf
from distsched_app.context import RunContext
from distsched_app.errors import DuplicateTask, RunCancelled, UnknownTask
from distsched_app.logutils import DistschedFormatter, JsonFormatter, KeyValueFormatter
from distsched_app.registry import TaskRegistry


def test_fake_clock_set_and_advance():
    clock = FakeClock("2026-01-01T00:00:00+00:00")
    assert clock.now() == datetime(2026, 1, 1, tzinfo=timezone.utc)
    clock.advance(seconds=90)
    clock.advance(hours=1)
    assert clock.now() == datetime(2026, 1, 1, 1, 1, 30, tzinfo=timezone.utc)
    clock.set("2026-06-01T12:00:00+02:00")
    assert clock.now() == datetime(2026, 6, 1, 10, tzinfo=timezone.utc)
    with pytest.raises(ValueError):
        clock.set(datetime(2026, 1, 1))  # naive


def test_system_clock_is_aware_utc():
    now = SystemClock().now()
    assert now.utcoffset() == timedelta(0)


def test_registry_register_get_and_duplicates():
    reg = TaskRegistry()

    def a(x, context=None):
        return x

    def b():
        return None

    entry = reg.register("a", a)
    assert entry.accepts_context and reg.get("a").func is a
    reg.register("a", a)  # the same function again (e.g. module imported twice) is harmless
    with pytest.raises(DuplicateTask):
        reg.register("a", b)
    with pytest.raises(UnknownTask):
        reg.get("missing")
    with pytest.raises(DuplicateTask):
        reg.register("bad name!", b)
    assert not reg.register("b", b).accepts_context


def test_kwargs_only_task_does_not_get_context():
    reg = TaskRegistry()
    assert not reg.register("k", lambda **kwargs: kwargs).accepts_context


def test_context_fencing_token_and_cancel():
    flag = {"v": False}
    ctx = RunContext(
        run_id=7,
        schedule_id=1,
        schedule_name="s",
        worker_id="w",
        attempt=3,
        scheduled_for=datetime(2026, 1, 1, tzinfo=timezone.utc),
        idempotency_key="s:x",
        _cancel_probe=lambda: flag["v"],
    )
    assert ctx.fencing_token == "7:3"
    ctx.raise_if_cancelled()
    flag["v"] = True
    assert ctx.cancel_requested()
    with pytest.raises(RunCancelled):
        ctx.raise_if_cancelled()
    with pytest.raises(AttributeError):
        ctx.attempt = 4  # frozen


def test_conf_defaults_and_overrides(settings):
    settings.DISTSCHED = {}
    assert conf.LEASE_SECONDS == 30
    settings.DISTSCHED = {"LEASE_SECONDS": 5}
    assert conf.LEASE_SECONDS == 5
    with pytest.raises(AttributeError):
        conf.NOT_A_SETTING  # noqa: B018


def _record(**fields) -> logging.LogRecord:
    record = logging.LogRecord("distsched", logging.INFO, __file__, 1, "run finished", None, None)
    record.distsched = fields
    return record


def test_key_value_format_quotes_spaces():
    line = KeyValueFormatter().format(_record(run_id=3, error="ValueError: bad thing"))
    assert line.split(" ", 1)[1] == 'INFO run finished run_id=3 error="ValueError: bad thing"'


def test_json_format_is_one_object_per_line():
    data = json.loads(JsonFormatter().format(_record(run_id=3, state="succeeded")))
    assert data["msg"] == "run finished" and data["run_id"] == 3 and data["state"] == "succeeded"


def test_distsched_formatter_follows_log_format_setting(settings):
    settings.DISTSCHED = {"LOG_FORMAT": "json"}
    assert json.loads(DistschedFormatter().format(_record(run_id=1)))["run_id"] == 1
    settings.DISTSCHED = {"LOG_FORMAT": "text"}
    assert "run_id=1" in DistschedFormatter().format(_record(run_id=1))
