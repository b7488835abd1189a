"""Schedules declared in code (``services.declared_schedules``): idempotent, audited from source
``settings``, an operator's pause stands, code wins over an operator's edit, removal pauses."""

from __future__ import annotations

import logging

import pytest

from distsched_app.models import AuditEntry, Schedule
from distsched_app.services import schedules
from distsched_app.services.declared_schedules import apply_at_startup, apply_declared, problems

pytestmark = pytest.mark.django_db

NIGHTLY = {"task": "tests.echo", "cron": "0 3 * * *", "timezone": "Europe/Paris", "args": [1], "queue": "reports"}
DECLARED = {"nightly": NIGHTLY, "ping": {"task": "tests.noop", "interval_seconds": 60, "max_attempts": 5}}


def actions(report):
    return {o.name: o.action for o in report.outcomes}


def test_first_apply_creates_every_declared_schedule_recorded_from_settings(clock):
    report = apply_declared(clock, DECLARED)
    assert actions(report) == {"nightly": "created", "ping": "created"}
    s = Schedule.objects.get(name="nightly")
    assert (s.task_name, s.cron, s.timezone, s.args, s.queue, s.paused) == (
        "tests.echo", "0 3 * * *", "Europe/Paris", [1], "reports", False,
    )  # fmt: skip
    assert s.declared == {"source": "settings", "paused": False}
    assert Schedule.objects.get(name="ping").max_attempts == 5
    entry = AuditEntry.objects.get(target="nightly")
    assert (entry.action, entry.actor, entry.source, entry.reason) == (
        "create", "settings", "settings", "declared in settings",
    )  # fmt: skip


def test_applying_twice_changes_nothing_and_records_nothing(clock):
    apply_declared(clock, DECLARED)
    rows = list(Schedule.objects.order_by("name").values())
    entries = AuditEntry.objects.count()
    clock.advance(minutes=5)
    report = apply_declared(clock, DECLARED)
    assert actions(report) == {"nightly": "unchanged", "ping": "unchanged"}
    assert not report.changed
    assert list(Schedule.objects.order_by("name").values()) == rows
    assert AuditEntry.objects.count() == entries


def test_a_field_changed_in_code_wins_at_the_next_apply(clock):
    apply_declared(clock, DECLARED)
    report = apply_declared(clock, {**DECLARED, "nightly": {**NIGHTLY, "cron": "0 4 * * *"}})
    assert actions(report)["nightly"] == "updated"
    assert report.outcomes[0].changes == {"cron": ["0 3 * * *", "0 4 * * *"]}
    s = Schedule.objects.get(name="nightly")
    assert (s.cron, s.version) == ("0 4 * * *", 2)
    assert AuditEntry.objects.filter(target="nightly").first().source == "settings"


def test_switching_kind_in_code_clears_the_old_one(clock):
    apply_declared(clock, DECLARED)
    apply_declared(clock, {**DECLARED, "nightly": {"task": "tests.echo", "interval_seconds": 300, "queue": "reports"}})
    s = Schedule.objects.get(name="nightly")
    assert (s.kind, s.interval_seconds, s.cron, s.timezone, s.args) == ("interval", 300, "", "UTC", [])


def test_an_operators_edit_of_a_declared_field_is_overwritten(clock):
    apply_declared(clock, DECLARED)
    schedules.update_schedule("nightly", now=clock.now(), queue="urgent", actor="user:ops", source="admin")
    report = apply_declared(clock, DECLARED)
    assert report.outcomes[0].changes == {"queue": ["urgent", "reports"]}
    assert Schedule.objects.get(name="nightly").queue == "reports"


def test_an_operators_pause_stands_and_so_does_a_resume(clock):
    apply_declared(clock, DECLARED)
    schedules.pause_schedule("nightly", now=clock.now(), actor="user:ops", source="admin", reason="incident")
    assert actions(apply_declared(clock, DECLARED))["nightly"] == "unchanged"
    assert Schedule.objects.get(name="nightly").paused is True
    # Declared paused in code: the operator resumes it; the next apply leaves it running.
    declared = {**DECLARED, "ping": {**DECLARED["ping"], "paused": True}}
    assert actions(apply_declared(clock, declared))["ping"] == "paused"
    schedules.resume_schedule("ping", now=clock.now(), actor="user:ops", source="admin")
    assert actions(apply_declared(clock, declared))["ping"] == "unchanged"
    assert Schedule.objects.get(name="ping").paused is False


def test_a_changed_paused_declaration_applies_once(clock):
    apply_declared(clock, DECLARED)
    declared = {**DECLARED, "ping": {**DECLARED["ping"], "paused": True}}
    report = apply_declared(clock, declared)
    assert actions(report)["ping"] == "paused"
    assert AuditEntry.objects.filter(target="ping").first().action == "pause"
    assert actions(apply_declared(clock, DECLARED))["ping"] == "resumed"
    assert Schedule.objects.get(name="ping").paused is False


def test_a_schedule_removed_from_code_is_paused_not_deleted_and_no_longer_declared(clock):
    apply_declared(clock, DECLARED)
    report = apply_declared(clock, {"ping": DECLARED["ping"]})
    assert actions(report) == {"ping": "unchanged", "nightly": "paused"}
    s = Schedule.objects.get(name="nightly")
    assert (s.paused, s.declared) == (True, None)
    entry = AuditEntry.objects.filter(target="nightly").first()
    assert (entry.action, entry.source, entry.reason) == ("pause", "settings", "removed from settings")
    # No longer declared: the next apply leaves it alone.
    assert actions(apply_declared(clock, {"ping": DECLARED["ping"]})) == {"ping": "unchanged"}


def test_removal_deletes_when_asked_and_keeps_when_asked(clock):
    apply_declared(clock, DECLARED)
    assert actions(apply_declared(clock, {"ping": DECLARED["ping"]}, prune="keep"))["ping"] == "unchanged"
    assert Schedule.objects.filter(name="nightly", paused=False).exists()
    report = apply_declared(clock, {"ping": DECLARED["ping"]}, prune="delete")
    assert actions(report)["nightly"] == "deleted"
    assert not Schedule.objects.filter(name="nightly").exists()
    assert AuditEntry.objects.filter(target="nightly").first().action == "delete"


def test_a_schedule_made_by_hand_is_never_paused_by_removal_but_adopted_when_declared(clock):
    schedules.create_schedule(name="manual", task_name="tests.noop", interval_seconds=30, now=clock.now())
    apply_declared(clock, DECLARED)
    assert Schedule.objects.get(name="manual").paused is False
    schedules.pause_schedule("manual", now=clock.now())
    report = apply_declared(clock, {**DECLARED, "manual": {"task": "tests.noop", "interval_seconds": 30}})
    assert actions(report)["manual"] == "resumed"  # adopted: the declaration's paused state applies
    assert Schedule.objects.get(name="manual").declared == {"source": "settings", "paused": False}


def test_a_bad_declaration_is_reported_and_the_others_applied(clock):
    report = apply_declared(clock, {**DECLARED, "broken": {"task": "tests.nope", "interval_seconds": 60}})
    assert actions(report) == {"broken": "failed", "nightly": "created", "ping": "created"}
    assert report.outcomes[0].message == "schedule 'broken' (task): no task registered as 'tests.nope'"
    assert not Schedule.objects.filter(name="broken").exists()


def test_dry_run_writes_nothing_and_says_what_it_would_do(clock):
    apply_declared(clock, DECLARED)
    before = list(Schedule.objects.order_by("name").values())
    entries = AuditEntry.objects.count()
    report = apply_declared(clock, {"nightly": {**NIGHTLY, "cron": "0 5 * * *"}}, dry_run=True)
    assert actions(report) == {"nightly": "updated", "ping": "paused"}
    assert list(Schedule.objects.order_by("name").values()) == before
    assert AuditEntry.objects.count() == entries


def test_problems_name_the_schedule_and_the_field(clock):
    found = problems(
        {
            "a": {"task": "tests.noop", "cron": "nope"},
            "b": {"task": "tests.noop", "interval_seconds": 60, "colour": "red"},
            "c": {"interval_seconds": 60},
            "d": {"task": "tests.noop", "interval_seconds": 60, "timezone": "Europe/Paris"},
        },
        now=clock.now(),
    )
    assert found[0].startswith("schedule 'a' (cron): invalid cron expression 'nope'")
    assert found[1].startswith("schedule 'b' has unknown key(s) colour (known: task, ")
    assert found[2] == "schedule 'c' needs a 'task'"
    assert found[3] == "schedule 'd' (timezone): timezone applies to cron schedules only, not to interval schedules"
    assert problems(None, now=clock.now()) == []
    assert problems([], now=clock.now()) == ["must be a dict of schedule name -> fields, not list"]


def test_startup_apply_does_nothing_without_the_setting_and_applies_it_when_set(clock, settings, caplog):
    settings.DISTSCHED = {}
    assert apply_at_startup(clock, process="ticker") is None
    settings.DISTSCHED = {"SCHEDULES": DECLARED}
    with caplog.at_level(logging.INFO, logger="distsched"):
        report = apply_at_startup(clock, process="ticker")
    assert report is not None and report.count("created") == 2
    assert "declared schedules applied" in caplog.text
    settings.DISTSCHED = {"SCHEDULES": {}}  # declared, and empty: every declared schedule is paused
    assert apply_at_startup(clock, process="ticker").count("paused") == 2


def test_a_ticker_that_loses_the_race_to_create_applies_to_the_winners_schedule(clock, monkeypatch):
    from distsched_app.services import declared_schedules

    apply_declared(clock, {"ping": DECLARED["ping"]})  # the other ticker's apply, committed
    looked = []

    def not_there_yet(name):  # what we saw just before the other ticker committed
        looked.append(name)
        return None

    monkeypatch.setattr(declared_schedules, "_locked", not_there_yet)
    report = apply_declared(clock, {"ping": DECLARED["ping"]})
    assert looked == ["ping"]
    assert actions(report) == {"ping": "unchanged"}  # our insert lost on the unique name: theirs stands
    assert AuditEntry.objects.filter(target="ping").count() == 1
