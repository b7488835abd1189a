"""``Leadership.turn``: the leader alone ticks and prunes; a deposed one writes nothing."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

from distsched_app.clock import FakeClock
from distsched_app.models import Leader, Run, RunState
from distsched_app.services.leader_chores import REPORT_EVERY_SECONDS, Leadership
from tests.conftest import T0
from tests.services.test_maintenance import make_run

pytestmark = pytest.mark.django_db(transaction=True)

DAY = timedelta(days=1)


@pytest.fixture
def mono():
    """A FakeClock read as the processes' monotonic clock."""
    clock = FakeClock()
    start = clock.now()
    clock.read = lambda: (clock.now() - start).total_seconds()  # type: ignore[attr-defined]
    return clock


def leadership(holder: str, mono) -> Leadership:
    return Leadership(holder=holder, lease_seconds=15, monotonic=mono.read)


def test_only_the_leader_ticks(make_schedule, mono):
    make_schedule("due", interval_seconds=60, start_at=T0 - timedelta(minutes=1))
    a, b = leadership("a", mono), leadership("b", mono)
    created = a.turn(T0)
    assert created is not None and len(created) == 1
    make_schedule("due-too", interval_seconds=60, start_at=T0 - timedelta(minutes=1))
    assert b.turn(T0) is None  # a standby: no tick
    assert Run.objects.count() == 1
    assert a.turn(T0) is not None and Run.objects.count() == 2


def test_the_leader_applies_retention_and_logs_its_figures(make_schedule, mono, settings, caplog):
    settings.DISTSCHED = {"RETENTION": {"succeeded": "7d"}}
    sched = make_schedule("s1", start_at=T0 + DAY)  # not due: the turn ticks nothing
    for _ in range(3):
        make_run(sched, RunState.SUCCEEDED, finished_at=T0 - 8 * DAY)
    kept = make_run(sched, RunState.SUCCEEDED, finished_at=T0 - 6 * DAY)
    a = leadership("a", mono)
    with caplog.at_level(logging.INFO, logger="distsched"):
        a.turn(T0)
        assert list(Run.objects.values_list("pk", flat=True)) == [kept.pk]
        for _ in range(int(REPORT_EVERY_SECONDS / 4) + 1):  # a turn every 4 s: it renews and stays leader
            mono.advance(4)
            assert a.turn(T0) is not None
    [line] = [r.distsched for r in caplog.records if r.getMessage() == "retention deleted runs"]
    assert (line["runs"], line["events"]) == (3, 6)
    assert line["rows_per_second"] > 0


def test_a_deposed_leader_is_fenced_out_steps_down_and_writes_nothing(make_schedule, mono, caplog):
    a = leadership("a", mono)
    assert a.turn(T0) == []  # leads, nothing due
    Leader.objects.update(expires_at=T0 - DAY)  # paused past its lease (its local clock has not moved)
    assert leadership("b", mono).elector.step() is True  # b takes over with term 2
    make_schedule("due", interval_seconds=60, start_at=T0 - timedelta(minutes=1))
    with caplog.at_level(logging.WARNING, logger="distsched"):
        assert a.turn(T0) is None
    assert Run.objects.count() == 0
    assert a.elector.term is None
    [reason] = [r.distsched["reason"] for r in caplog.records if r.getMessage() == "stepped down"]
    assert reason.startswith("fenced out")
