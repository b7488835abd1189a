"""``claiming.next_due``: an idle worker's "when is the next run, the next slot due" is one statement
(both minimums), with the same answers as two aggregates."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Min
from django.test.utils import CaptureQueriesContext

from distsched_app.models import Schedule
from distsched_app.services import claiming
from distsched_app.services.enqueue import Job, enqueue
from tests.conftest import T0

pytestmark = pytest.mark.django_db


def test_nothing_due_is_none_for_both_in_one_statement():
    with CaptureQueriesContext(connection) as queries:
        due = claiming.next_due(queues=None)
    assert (due.run, due.schedule) == (None, None)
    assert len(queries) == 1


def test_the_earliest_run_and_slot_to_the_microsecond_per_queue(clock, make_schedule):
    at = T0 + timedelta(seconds=7, microseconds=123456)
    enqueue(Job(task_name="tests.noop", queue="a", run_after=at), now=clock.now())
    enqueue(Job(task_name="tests.noop", queue="a", run_after=at + timedelta(seconds=3)), now=clock.now())
    enqueue(Job(task_name="tests.noop", queue="b", run_after=at - timedelta(seconds=1)), now=clock.now())
    make_schedule("in-b", queue="b", interval_seconds=60)
    slot = Schedule.objects.get(name="in-b").next_run_at
    with CaptureQueriesContext(connection) as queries:
        due = claiming.next_due(queues=["a"])
    assert len(queries) == 1
    assert (due.run, due.schedule) == (at, None)  # b's run and b's schedule are not a's
    everything = claiming.next_due(queues=None)
    assert everything.run == at - timedelta(seconds=1) and everything.schedule == slot
    assert everything.schedule == Schedule.objects.aggregate(m=Min("next_run_at"))["m"]
    assert claiming.next_due(queues=["b"]).schedule == slot


def test_paused_schedules_are_not_due(clock, make_schedule):
    make_schedule("paused", interval_seconds=60)
    Schedule.objects.update(paused=True)
    assert claiming.next_due(queues=None).schedule is None
