"""``distsched schedule create --if-absent``: repeatable in a deploy script."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError

from distsched_app.models import Schedule

pytestmark = pytest.mark.django_db

CREATE = ("schedule", "create", "nightly", "--task", "tests.noop")


def test_absent_it_is_created(cli):
    doc = json.loads(cli(*CREATE, "--interval", "60", "--if-absent", "--json"))
    assert (doc["name"], doc["interval_seconds"], doc["created"]) == ("nightly", 60, True)
    assert Schedule.objects.get(name="nightly").interval_seconds == 60


def test_present_it_says_so_changes_nothing_and_exits_0(cli):
    cli(*CREATE, "--interval", "60")
    before = Schedule.objects.values().get(name="nightly")
    out = cli(*CREATE, "--interval", "3600", "--paused", "--if-absent")
    assert out == "schedule nightly exists (every 60s, task tests.noop): nothing changed\n"
    assert Schedule.objects.values().get(name="nightly") == before
    doc = json.loads(cli(*CREATE, "--interval", "3600", "--if-absent", "--json"))
    assert (doc["interval_seconds"], doc["created"]) == (60, False)
    assert Schedule.objects.count() == 1


def test_present_a_run_at_now_past_still_passes(cli, clock):
    cli("schedule", "create", "once", "--task", "tests.noop", "--run-at", "2026-03-02T10:00:00Z")
    clock.advance(hours=2)  # the deploy script runs again, after the slot
    out = cli("schedule", "create", "once", "--task", "tests.noop", "--run-at", "2026-03-02T10:00:00Z", "--if-absent")
    assert out.startswith("schedule once exists")


def test_absent_its_options_are_still_validated(cli):
    with pytest.raises(CommandError, match=r"no task registered as 'tests\.nope'"):
        cli("schedule", "create", "x", "--task", "tests.nope", "--interval", "60", "--if-absent")
    assert not Schedule.objects.exists()


def test_without_the_flag_an_existing_name_is_still_an_error(cli):
    cli(*CREATE, "--interval", "60")
    with pytest.raises(CommandError) as info:
        cli(*CREATE, "--interval", "60")
    assert str(info.value) == "a schedule named 'nightly' already exists"


def test_a_creator_that_loses_the_race_for_the_name_says_it_exists(cli, monkeypatch):
    from distsched_app.management.cli import verbs

    cli(*CREATE, "--interval", "60")
    monkeypatch.setattr(verbs, "_existing_schedule", lambda name: None)  # it looked before the other committed
    assert cli(*CREATE, "--interval", "60", "--if-absent").startswith("schedule nightly exists")
