"""``distsched import celery-beat``: sources, --dry-run, --print-settings, reports and exit codes."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.management import CommandError

from distsched_app.models import Schedule
from distsched_app.services.declared_schedules import problems

pytestmark = pytest.mark.django_db


class crontab:
    def __init__(self, minute="*", hour="*", day_of_week="*", day_of_month="*", month_of_year="*"):
        self._orig_minute, self._orig_hour, self._orig_day_of_week = minute, hour, day_of_week
        self._orig_day_of_month, self._orig_month_of_year = day_of_month, month_of_year


# Read by --from tests.adapters.cli.test_import_celery_beat:BEAT
BEAT = {
    "nightly-report": {"task": "tests.echo", "schedule": crontab(hour=3, minute=0), "args": (42,)},
    "poll-partner": {"task": "tests.noop", "schedule": timedelta(minutes=5), "options": {"queue": "io"}},
    "fast": {"task": "tests.noop", "schedule": 0.25},
}
FROM = ("import", "celery-beat", "--from", "tests.adapters.cli.test_import_celery_beat:BEAT")


def test_from_a_module_it_creates_the_schedules_and_reports_what_it_could_not(cli):
    out = cli(*FROM, "--timezone", "Europe/Paris")
    assert "nightly-report  created  cron 0 3 * * * (Europe/Paris), task tests.echo" in out
    assert "fast            skipped  every 0.25s: distsched intervals are whole seconds, at least 1" in out
    assert out.rstrip().endswith("tests.adapters.cli.test_import_celery_beat:BEAT: 2 created, 1 not translated")
    s = Schedule.objects.get(name="nightly-report")
    assert (s.cron, s.timezone, s.args) == ("0 3 * * *", "Europe/Paris", [42])
    assert Schedule.objects.get(name="poll-partner").queue == "io"
    again = cli(*FROM, "--timezone", "Europe/Paris")
    assert again.rstrip().endswith(": 2 exists, 1 not translated") and Schedule.objects.count() == 2


def test_crontabs_are_read_in_celery_timezone_by_default(cli, settings):
    settings.CELERY_TIMEZONE = "America/New_York"
    cli(*FROM)
    assert Schedule.objects.get(name="nightly-report").timezone == "America/New_York"


def test_dry_run_writes_nothing(cli):
    out = cli(*FROM, "--dry-run")
    assert "would be created" in out and "dry run, nothing written" in out
    assert not Schedule.objects.exists()


def test_print_settings_prints_a_snippet_the_check_accepts(cli, clock):
    out = cli(*FROM, "--print-settings")
    assert "# not translated: fast: every 0.25s" in out
    namespace: dict = {"DISTSCHED": {}}
    exec(out, namespace)  # noqa: S102 - the snippet is Python meant to be pasted into settings.py
    declared = namespace["DISTSCHED"]["SCHEDULES"]
    assert declared["poll-partner"] == {"task": "tests.noop", "interval_seconds": 300, "queue": "io"}
    assert problems(declared, now=clock.now()) == []
    assert not Schedule.objects.exists()


def test_from_settings_and_from_a_json_file(cli, settings, tmp_path):
    settings.CELERY_BEAT_SCHEDULE = {"tick": {"task": "tests.noop", "schedule": 10}}
    doc = json.loads(cli("import", "celery-beat", "--json"))
    assert doc["source"] == ["CELERY_BEAT_SCHEDULE"]
    assert doc["written"] == [{"name": "tick", "action": "created", "message": ""}]
    path = tmp_path / "beat.json"
    path.write_text(
        json.dumps(
            {"weekly": {"task": "tests.noop", "schedule": {"crontab": {"minute": 0, "hour": 8, "day_of_week": "mon"}}}}
        )
    )
    cli("import", "celery-beat", "--from", str(path))
    assert Schedule.objects.get(name="weekly").cron == "0 8 * * MON"


def test_nothing_to_read_is_the_only_failure(cli, settings):
    assert not hasattr(settings, "CELERY_BEAT_SCHEDULE")
    with pytest.raises(CommandError, match=r"^nothing to import: no CELERY_BEAT_SCHEDULE in the settings"):
        cli("import", "celery-beat")
    with pytest.raises(CommandError, match=r"^--from: tests has no attribute 'NOPE'$"):
        cli("import", "celery-beat", "--from", "tests:NOPE")
    # Entries it cannot translate are reported, not an error.
    settings.CELERY_BEAT_SCHEDULE = {"x": {"task": "tests.noop", "schedule": "sometimes"}}
    assert cli("import", "celery-beat").rstrip().endswith("CELERY_BEAT_SCHEDULE: 1 not translated")


def test_django_celery_beat_rows_are_read_when_the_app_is_installed(cli, monkeypatch):
    from types import SimpleNamespace

    from distsched_app.services import celery_beat

    row = SimpleNamespace(
        name="hourly", task="tests.noop", args="[]", kwargs='{"a": 1}', enabled=True, queue=None, priority=None,
        expires=None, interval=SimpleNamespace(every=1, period="hours"), crontab=None, solar=None, clocked=None,
    )  # fmt: skip
    monkeypatch.setattr(celery_beat, "django_celery_beat_tasks", lambda: [row])
    out = cli("import", "celery-beat")
    assert out.rstrip().endswith("django-celery-beat: 1 created")
    s = Schedule.objects.get(name="hourly")
    assert (s.interval_seconds, s.kwargs) == (3600, {"a": 1})
