"""What every distsched admin page shares: a staff login, and 404 for buttons on missing objects."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.adapters.admin.pages import (
    EVENTS,
    RUNS,
    SCHEDULES,
    WORKERS,
)

pytestmark = pytest.mark.django_db


def test_object_buttons_on_missing_or_malformed_ids_are_404(staff):
    assert staff.post(RUNS + "abc/requeue/").status_code == 404
    assert staff.post(RUNS + "424242/cancel/").status_code == 404
    assert staff.post(SCHEDULES + "999/pause/").status_code == 404


def test_admin_pages_need_a_staff_login(client):
    for url in (SCHEDULES, RUNS, WORKERS, EVENTS, reverse("admin:distsched_dashboard")):
        response = client.get(url)
        assert response.status_code == 302 and "/login/" in response["Location"]
