"""``distsched schedule apply``: DISTSCHED["SCHEDULES"] or a file, --dry-run, --delete-removed, exit codes."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from distsched_app.management.commands.distsched import Command
from distsched_app.models import AuditEntry, Schedule

pytestmark = pytest.mark.django_db

DECLARED = {"ping": {"task": "tests.noop", "interval_seconds": 60}}
# Read by --file tests.adapters.cli.test_schedule_apply:FROM_MODULE.
FROM_MODULE = {"pong": {"task": "tests.noop", "cron": "*/5 * * * *"}}


def test_applies_the_settings_and_says_what_it_did(cli, settings):
    settings.DISTSCHED = {"SCHEDULES": DECLARED}
    out = cli("schedule", "apply")
    assert "ping" in out and "created" in out and "every 60s, task tests.noop" in out
    assert out.rstrip().endswith("\n\nsettings: 1 created")
    entry = AuditEntry.objects.get(target="ping")
    assert entry.source == "settings" and entry.actor.startswith("cli:")
    doc = json.loads(cli("schedule", "apply", "--json"))
    assert doc["schedules"] == [{"name": "ping", "action": "unchanged", "changes": {}, "message": ""}]
    assert doc["summary"]["unchanged"] == 1 and doc["source"] == "settings"


def test_without_the_setting_or_a_file_it_is_a_one_line_error(cli, settings):
    settings.DISTSCHED = {}
    with pytest.raises(
        CommandError, match=r"^DISTSCHED\['SCHEDULES'\] is not set: nothing is declared \(or give --file\)$"
    ):
        cli("schedule", "apply")


def test_from_a_json_file_and_from_a_module(cli, tmp_path, settings):
    settings.DISTSCHED = {}
    path = tmp_path / "schedules.json"
    path.write_text(json.dumps(DECLARED))
    doc = json.loads(cli("schedule", "apply", "--file", str(path), "--json"))
    assert [(s["name"], s["action"]) for s in doc["schedules"]] == [("ping", "created")]
    assert Schedule.objects.get(name="ping").declared["source"] == str(path)
    out = cli("schedule", "apply", "--file", "tests.adapters.cli.test_schedule_apply:FROM_MODULE")
    assert "pong" in out and "ping" in out and "removed from tests.adapters.cli.test_schedule_apply:FROM_MODULE" in out
    assert Schedule.objects.get(name="ping").paused is True


def test_a_file_that_cannot_be_read_is_a_one_line_error(cli, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(CommandError, match=r"^--file: .*bad\.json is not valid JSON: "):
        cli("schedule", "apply", "--file", str(bad))
    with pytest.raises(CommandError, match=r"^--file: cannot import no_such_module_x: ModuleNotFoundError"):
        cli("schedule", "apply", "--file", "no_such_module_x:S")


def test_dry_run_and_delete_removed(cli, settings):
    settings.DISTSCHED = {"SCHEDULES": DECLARED}
    cli("schedule", "apply")
    settings.DISTSCHED = {"SCHEDULES": {}}
    out = cli("schedule", "apply", "--dry-run", "--delete-removed")
    assert "would be deleted" in out and out.rstrip().startswith("SCHEDULE")
    assert "dry run, nothing changed: settings:" in out
    assert Schedule.objects.filter(name="ping", paused=False).exists()
    cli("schedule", "apply", "--delete-removed")
    assert not Schedule.objects.exists()


def test_a_declaration_that_fails_prints_the_report_and_exits_1(clock, settings):
    settings.DISTSCHED = {"SCHEDULES": {**DECLARED, "bad": {"task": "tests.nope", "interval_seconds": 5}}}
    out = StringIO()
    with pytest.raises(SystemExit) as info:
        call_command(Command(), "schedule", "apply", stdout=out, stderr=StringIO())
    assert info.value.code == 1
    assert "no task registered as 'tests.nope'" in out.getvalue() and "1 created" in out.getvalue()
    assert Schedule.objects.filter(name="ping").exists()
