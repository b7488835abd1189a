"""Declared schedules are applied as a ticker starts: ``tick --loop`` and ``runworker --with-tick``."""

from __future__ import annotations

import os
import signal

import pytest
from django.core.management import call_command

from distsched_app.models import AuditEntry, Run, Schedule

pytestmark = pytest.mark.django_db

DECLARED = {"ping": {"task": "tests.noop", "interval_seconds": 60}}


@pytest.fixture
def restore_signal_handlers():
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.mark.usefixtures("restore_signal_handlers")
def test_tick_loop_applies_the_declared_schedules_before_its_first_tick(monkeypatch, settings, clock):
    from distsched_app.services import leader_chores  # the loop ticks through its leadership

    settings.DISTSCHED = {"SCHEDULES": DECLARED}
    seen = []

    def tick(*, now, fence=None):
        seen.append(Schedule.objects.filter(name="ping").exists())
        os.kill(os.getpid(), signal.SIGTERM)
        return []

    monkeypatch.setattr(leader_chores, "tick", tick)
    call_command("tick", "--loop", "--interval", "0.001")
    assert seen == [True]
    assert AuditEntry.objects.get(target="ping").source == "settings"


def test_runworker_with_tick_applies_them_and_without_tick_does_not(settings, clock):
    settings.DISTSCHED = {"SCHEDULES": DECLARED}
    call_command("runworker", "--burst", "--worker-id", "plain")
    assert not Schedule.objects.exists()
    call_command("runworker", "--burst", "--with-tick", "--worker-id", "ticking")
    assert Schedule.objects.get(name="ping").declared == {"source": "settings", "paused": False}
    assert Run.objects.filter(schedule__name="ping", state="succeeded").count() == 1


def test_an_invalid_declaration_stops_the_ticker_at_start_up(settings, clock):
    from django.core.management.base import SystemCheckError

    settings.DISTSCHED = {"SCHEDULES": {"ping": {"task": "tests.nope", "interval_seconds": 60}}}
    with pytest.raises(SystemCheckError, match=r"distsched.E020.*schedule 'ping' \(task\): no task registered"):
        call_command("tick", skip_checks=False)
    assert not Schedule.objects.exists()
