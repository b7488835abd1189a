"""``distsched schedule update|delete|history|restore`` and reasons, ``prune --audit-older-than``."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError

from distsched_app.models import AuditEntry, Run, Schedule
from distsched_app.services.queues import cli_actor

pytestmark = pytest.mark.django_db


@pytest.fixture
def cli_json(cli):
    def run(*args: str):
        return json.loads(cli(*args, "--json"))

    return run


def error_of(cli, *args: str) -> str:
    with pytest.raises(CommandError) as info:
        cli(*args)
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_update_changes_fields_and_records_the_os_user(cli, cli_json, make_schedule):
    make_schedule("s1", interval_seconds=60)
    out = cli("schedule", "update", "s1", "--cron", "0 4 * * *", "--timezone", "Europe/Paris", "--reason", "later")
    assert out == "schedule s1 is now version 2: cron 0 4 * * * (Europe/Paris), task tests.noop\n"
    entry = AuditEntry.objects.latest("id")
    assert (entry.action, entry.actor, entry.source, entry.reason) == ("update", cli_actor(), "cli", "later")
    assert entry.changes["cron"] == ["", "0 4 * * *"] and entry.changes["interval_seconds"] == [60, None]
    doc = cli_json("schedule", "update", "s1", "--max-attempts", "7", "--expected-version", "2")
    assert (doc["version"], doc["max_attempts"]) == (3, 7)
    assert cli("schedule", "update", "s1", "--max-attempts", "7") == (
        "schedule s1 already had these values: nothing changed (version 3)\n"
    )


def test_update_refusals_are_one_line(cli, make_schedule):
    make_schedule("s1")
    assert "give at least one field" in error_of(cli, "schedule", "update", "s1")
    assert "version 1, not 5" in error_of(cli, "schedule", "update", "s1", "--queue", "q", "--expected-version", "5")
    assert "cron" in error_of(cli, "schedule", "update", "s1", "--cron", "nope")
    assert "no schedule named 'zz'" in error_of(cli, "schedule", "update", "zz", "--queue", "q")
    assert Schedule.objects.get().version == 1


def test_delete_needs_yes(cli, cli_json, scheduler, make_schedule):
    make_schedule("s1")
    [run] = scheduler.tick()
    assert error_of(cli, "schedule", "delete", "s1") == (
        "refusing to delete schedule s1 without --yes (its runs and history would be kept)"
    )
    assert Schedule.objects.exists()
    doc = cli_json("schedule", "delete", "s1", "--yes", "--reason", "retired")
    assert doc == {"name": "s1", "deleted": True, "runs_kept": 1}
    assert Run.objects.get(pk=run.pk).deleted_schedule == "s1"
    assert "no schedule named 's1'" in error_of(cli, "schedule", "delete", "s1", "--yes")


def test_history_and_restore(cli, cli_json, scheduler, make_schedule):
    make_schedule("s1", interval_seconds=60)
    cli("schedule", "pause", "s1", "--reason", "vendor outage")
    cli("schedule", "update", "s1", "--interval", "900")
    cli("schedule", "trigger", "s1")
    out = cli("schedule", "history", "s1")
    lines = out.splitlines()
    assert lines[0].split() == ["VERSION", "AT", "ACTION", "BY", "SOURCE", "REASON", "WHAT"]
    assert "interval_seconds: 60 -> 900" in lines[2] and "trigger" in lines[1]
    assert "vendor outage" in lines[3] and "paused: false -> true" in lines[3]
    doc = cli_json("schedule", "history", "s1", "--limit", "2")
    assert [(e["version"], e["action"]) for e in doc] == [(3, "trigger"), (3, "update")]
    assert doc[0]["run"] is not None and doc[0]["source"] == "cli"
    restored = cli_json("schedule", "restore", "s1", "1", "--reason", "typo")
    assert (restored["version"], restored["interval_seconds"], restored["paused"]) == (4, 60, True)
    assert cli("schedule", "restore", "s1", "2").startswith("schedule s1 is now version 5, with version 2's")
    assert "has no version 40" in error_of(cli, "schedule", "restore", "s1", "40")
    assert "version 5, not 1" in error_of(cli, "schedule", "restore", "s1", "1", "--expected-version", "1")


def test_the_history_of_a_deleted_schedule(cli, cli_json, make_schedule):
    make_schedule("s1")
    cli("schedule", "delete", "s1", "--yes")
    assert [e["action"] for e in cli_json("schedule", "history", "s1")] == ["delete", "create"]
    assert "no schedule named 'zz'" in error_of(cli, "schedule", "history", "zz")


def test_run_actions_take_a_reason(cli, scheduler, make_schedule):
    make_schedule("s1")
    [run] = scheduler.tick()
    cli("run", "cancel", str(run.pk), "--reason", "bad input")
    entry = AuditEntry.objects.get(target_kind="run")
    assert (entry.action, entry.actor, entry.source, entry.reason) == ("cancel", cli_actor(), "cli", "bad input")


def test_prune_leaves_the_audit_unless_told(cli_json, scheduler, make_schedule, clock):
    make_schedule("s1")
    cli_json("schedule", "delete", "s1", "--yes")
    clock.advance(days=500)
    doc = cli_json("prune", "--older-than", "30d")
    assert "audit_entries" not in doc and AuditEntry.objects.count() == 2
    assert cli_json("prune", "--older-than", "30d", "--audit-older-than", "400d", "--dry-run")["audit_entries"] == 2
    assert AuditEntry.objects.count() == 2
    assert cli_json("prune", "--older-than", "30d", "--audit-older-than", "400d")["audit_entries"] == 2
    assert not AuditEntry.objects.exists()


def test_prune_says_what_it_did_to_the_audit(cli, make_schedule, clock):
    make_schedule("s1")
    clock.advance(days=2)
    out = cli("prune", "--older-than", "30d", "--audit-older-than", "1d")
    assert out.rstrip().endswith("; deleted 1 audit entry from before 2026-03-03T09:00:00Z")
