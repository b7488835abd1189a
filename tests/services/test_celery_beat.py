"""Celery beat entries translated to schedules (``services.celery_beat``), Celery not installed:
crontabs and solar schedules are recognised by their attributes, as Celery's own objects carry them."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from distsched_app.models import AuditEntry, Schedule
from distsched_app.services.celery_beat import import_schedules, translate, translate_periodic_tasks
from distsched_app.services.declared_schedules import problems


class crontab:
    def __init__(self, minute="*", hour="*", day_of_week="*", day_of_month="*", month_of_year="*"):
        self._orig_minute, self._orig_hour, self._orig_day_of_week = minute, hour, day_of_week
        self._orig_day_of_month, self._orig_month_of_year = day_of_month, month_of_year


class solar:
    def __init__(self, event, lat, lon):
        self.event, self.lat, self.lon = event, lat, lon


def test_intervals_in_seconds_and_timedeltas():
    out = translate(
        {
            "poll": {"task": "tests.noop", "schedule": 300.0},
            "hourly": {"task": "tests.noop", "schedule": timedelta(hours=1)},
            "every": {"task": "tests.noop", "schedule": SimpleNamespace(run_every=timedelta(seconds=45))},
        }
    )
    assert out.schedules == {
        "poll": {"task": "tests.noop", "interval_seconds": 300},
        "hourly": {"task": "tests.noop", "interval_seconds": 3600},
        "every": {"task": "tests.noop", "interval_seconds": 45},
    }
    assert out.skipped == {} and out.notes == {}


def test_crontabs_objects_and_json_dicts_become_cron_in_the_given_zone():
    out = translate(
        {
            "nightly": {"task": "tests.noop", "schedule": crontab(minute=0, hour=3)},
            "weekdays": {
                "task": "tests.noop",
                "schedule": crontab(minute="*/15", hour={9, 17}, day_of_week="monday-friday"),
            },
            "json": {
                "task": "tests.noop",
                "schedule": {"crontab": {"minute": "30", "hour": "4", "month_of_year": "1"}},
            },
        },
        timezone="Europe/Paris",
    )
    assert out.schedules["nightly"] == {"task": "tests.noop", "cron": "0 3 * * *", "timezone": "Europe/Paris"}
    assert out.schedules["weekdays"]["cron"] == "*/15 9,17 * * mon-fri"
    assert out.schedules["json"]["cron"] == "30 4 * 1 *"
    assert problems(out.schedules, now=datetime(2026, 3, 2, tzinfo=timezone.utc)) == []


def test_args_kwargs_queue_and_disabled_entries_are_carried_other_options_noted():
    out = translate(
        {
            "report": {
                "task": "tests.echo",
                "schedule": 60,
                "args": (1, "a"),
                "kwargs": {"k": 2},
                "options": {"queue": "reports", "priority": 5, "expires": 30, "routing_key": "x"},
                "enabled": False,
            }
        }
    )
    assert out.schedules["report"] == {
        "task": "tests.echo", "interval_seconds": 60, "args": [1, "a"], "kwargs": {"k": 2}, "queue": "reports",
        "paused": True,
    }  # fmt: skip
    notes = out.notes["report"]
    assert [n.split(" ")[0] for n in notes] == ["priority", "expires", "option"]
    assert "'routing_key' is not carried" in notes[2]


def test_untranslatable_entries_are_reported_with_why_and_the_rest_kept():
    out = translate(
        {
            "sunrise": {"task": "tests.noop", "schedule": solar("sunrise", 48.8, 2.3)},
            "fast": {"task": "tests.noop", "schedule": 0.5},
            "seconds": {"task": "tests.noop", "schedule": {"crontab": {"second": "*/10", "minute": "*"}}},
            "first-monday": {"task": "tests.noop", "schedule": crontab(0, 9, day_of_week=1, day_of_month="1-7")},
            "notask": {"schedule": 60},
            "odd": {"task": "tests.noop", "schedule": "every day"},
            "ok": {"task": "tests.noop", "schedule": 60},
        }
    )
    assert list(out.schedules) == ["ok"]
    assert out.skipped == {
        "sunrise": "solar schedules (sunrise) have no equivalent; use a cron in a time zone",
        "fast": "every 0.5s: distsched intervals are whole seconds, at least 1",
        "seconds": "crontab field(s) second have no equivalent (cron has minutes, not seconds)",
        "first-monday": "Celery fires when day_of_month AND day_of_week match; cron fires when either does: "
        "no equivalent",
        "notask": "it names no task",
        "odd": "schedule 'every day' is not an interval (seconds, timedelta) or a crontab",
    }


def test_unknown_tasks_are_translated_with_a_warning_and_names_become_slugs():
    out = translate({"add every 30s": {"task": "proj.tasks.add", "schedule": 30}})
    assert list(out.schedules) == ["add-every-30s"]
    assert out.notes["add-every-30s"] == [
        "renamed from 'add every 30s'",
        "task 'proj.tasks.add' is not registered here: declare it with @task (a framework task by its module path)",
    ]


def periodic(name, task="tests.noop", **kw):
    base = {"interval": None, "crontab": None, "solar": None, "clocked": None, "queue": None, "priority": None}
    base |= {"args": "[]", "kwargs": "{}", "enabled": True, "expires": None}
    return SimpleNamespace(name=name, task=task, **{**base, **kw})


def test_django_celery_beat_rows():
    rows = [
        periodic("every-5", interval=SimpleNamespace(every=5, period="minutes"), args="[7]", queue="io"),
        periodic(
            "nightly",
            crontab=SimpleNamespace(
                minute="0", hour="3", day_of_week="*", day_of_month="*", month_of_year="*", timezone="Asia/Tokyo"
            ),
            enabled=False,
        ),
        periodic("once", clocked=SimpleNamespace(clocked_time=datetime(2027, 1, 1, tzinfo=timezone.utc))),
        periodic("dawn", solar=solar("dawn_civil", 1, 2)),
        periodic("celery.backend_cleanup", task="celery.backend_cleanup", crontab=SimpleNamespace()),
    ]
    out = translate_periodic_tasks(rows)
    assert out.schedules == {
        "every-5": {"task": "tests.noop", "interval_seconds": 300, "args": [7], "queue": "io"},
        "nightly": {"task": "tests.noop", "cron": "0 3 * * *", "timezone": "Asia/Tokyo", "paused": True},
        "once": {"task": "tests.noop", "run_at": "2027-01-01T00:00:00+00:00"},
    }
    assert list(out.skipped) == ["dawn"]


@pytest.mark.django_db
def test_import_creates_what_is_missing_and_importing_twice_changes_nothing(clock):
    found = translate({"poll": {"task": "tests.noop", "schedule": 300}, "ghost": {"task": "nope.x", "schedule": 5}})
    done = import_schedules(found.schedules, now=clock.now(), actor="cli:ops", reason="imported from x")
    assert [(d.name, d.action) for d in done] == [("poll", "created"), ("ghost", "failed")]
    assert done[1].message == "schedule 'ghost' (task): no task registered as 'nope.x'"
    s = Schedule.objects.get(name="poll")
    assert (s.interval_seconds, s.declared) == (300, None)  # an operator's schedule, not a declared one
    entry = AuditEntry.objects.get(target="poll")
    assert (entry.source, entry.actor, entry.reason) == ("cli", "cli:ops", "imported from x")
    before = list(Schedule.objects.values())
    again = import_schedules(found.schedules, now=clock.now(), actor="cli:ops", reason="imported from x")
    assert (again[0].name, again[0].action, again[0].message) == ("poll", "exists", "the same: nothing to do")
    assert list(Schedule.objects.values()) == before and AuditEntry.objects.count() == 1
    changed = translate({"poll": {"task": "tests.noop", "schedule": 600}})
    assert import_schedules(changed.schedules, now=clock.now(), actor="a", reason="r")[0].message == (
        "left as it is; differs in interval_seconds"
    )
    dry = import_schedules(
        {"new": {"task": "tests.noop", "interval_seconds": 5}}, now=clock.now(), actor="a", reason="r", dry_run=True
    )
    assert [(d.name, d.action) for d in dry] == [("new", "created")] and not Schedule.objects.filter(
        name="new"
    ).exists()


def test_a_crontab_with_seconds_is_reported_and_one_with_its_own_zone_keeps_it():
    seconds, zoned = crontab(minute="*"), crontab(minute=0, hour=6)
    seconds._orig_second = "*/10"  # the crontabs some projects extend with seconds
    zoned.tz = "Asia/Tokyo"
    at_zero = crontab(minute=5)
    at_zero._orig_second = 0
    out = translate(
        {
            "s": {"task": "tests.noop", "schedule": seconds},
            "z": {"task": "tests.noop", "schedule": zoned},
            "zero": {"task": "tests.noop", "schedule": at_zero},
        }
    )
    assert out.skipped == {"s": "crontab field(s) second have no equivalent (cron has minutes, not seconds)"}
    assert out.schedules["z"] == {"task": "tests.noop", "cron": "0 6 * * *", "timezone": "Asia/Tokyo"}
    assert out.schedules["zero"]["cron"] == "5 * * * *"
