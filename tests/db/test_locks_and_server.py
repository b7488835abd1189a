"""db.locks and db.server: the vendor differences callers no longer test for themselves."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import connection

from distsched_app.db import locks, server
from distsched_app.models import Run, Schedule

pytestmark = pytest.mark.django_db


def test_locks_select_for_update_only_where_rows_can_be_locked():
    postgres = connection.vendor == "postgresql"
    skipping = locks.skip_locked(Run.objects.filter(pk=1).select_related("schedule"), of=("self",))
    waiting = locks.row_locked(Run.objects.filter(pk=1))
    assert skipping.query.select_for_update is postgres
    assert skipping.query.select_for_update_skip_locked is postgres
    assert waiting.query.select_for_update is postgres and not waiting.query.select_for_update_skip_locked
    if postgres:
        assert skipping.query.select_for_update_of == ("self",)
    assert list(skipping) == [] and list(waiting) == []  # and they run (inside the test's transaction)


def test_server_answers_none_where_the_question_has_no_meaning():
    if connection.vendor == "postgresql":
        assert isinstance(server.clock_timestamp(), datetime)
        assert abs((server.clock_timestamp() - datetime.now(UTC)).total_seconds()) < 5
        assert isinstance(server.row_estimate(Schedule), int)
        assert server.counts_are_costly()
    else:
        assert server.clock_timestamp() is None
        assert server.row_estimate(Schedule) is None
        assert not server.counts_are_costly()
