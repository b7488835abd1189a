"""The system checks of DISTSCHED["SCHEDULES"] and DISTSCHED["TASK_OPTIONS"]: one clear error each."""

from __future__ import annotations

import pytest

from distsched_app.checks import check_distsched_settings


def errors(settings, **user):
    settings.DISTSCHED = user
    return [(m.id, m.msg) for m in check_distsched_settings(None) if m.id.startswith("distsched.E")]


def test_valid_declared_schedules_pass(settings):
    assert errors(settings, SCHEDULES={"ping": {"task": "tests.noop", "interval_seconds": 60}}) == []


def test_each_invalid_schedule_is_an_error_naming_it_and_its_field(settings):
    found = errors(
        settings,
        SCHEDULES={
            "ping": {"task": "tests.noop", "interval_seconds": 0},
            "ok": {"task": "tests.noop", "cron": "0 3 * * *"},
            "typo": {"task": "tests.noop", "cron": "0 3 * * *", "que": "x"},
        },
    )
    assert [i for i, _ in found] == ["distsched.E020", "distsched.E020"]
    assert found[0][1] == (
        "DISTSCHED['SCHEDULES'] schedule 'ping' (interval_seconds): interval_seconds must be between 1 and 316224000."
    )
    assert found[1][1].startswith("DISTSCHED['SCHEDULES'] schedule 'typo' has unknown key(s) que (known: task, ")


@pytest.mark.django_db
def test_the_check_writes_nothing(settings):
    from distsched_app.models import Schedule

    errors(settings, SCHEDULES={"ping": {"task": "tests.noop", "interval_seconds": 60}})
    assert not Schedule.objects.exists()
