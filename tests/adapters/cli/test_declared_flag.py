"""Operators see that a schedule is declared in code: the admin's change page, the API, the CLI."""

from __future__ import annotations

import json

import pytest

from distsched_app.models import Schedule
from distsched_app.services.declared_schedules import apply_declared
from tests.adapters.admin.pages import change_url

pytestmark = pytest.mark.django_db


def test_declared_is_shown_everywhere(clock, admin_client, api, cli, make_schedule):
    make_schedule("manual", interval_seconds=60)
    apply_declared(clock, {"ping": {"task": "tests.noop", "interval_seconds": 60}})
    page = admin_client.get(change_url(Schedule.objects.get(name="ping"))).content.decode()
    assert "Declared in code" in page and "yes, in settings: the next `schedule apply`" in page
    assert "no: made by hand" in admin_client.get(change_url(Schedule.objects.get(name="manual"))).content.decode()
    assert api.get("/api/schedules/ping").json()["declared"] is True
    assert api.get("/api/schedules/manual").json()["declared"] is False
    assert json.loads(cli("schedule", "show", "ping", "--json"))["declared"] is True
