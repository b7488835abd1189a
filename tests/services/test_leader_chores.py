"""``Leadership.turn``: the leader alone ticks and prunes; a deposed one writes nothing."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

import pytest

from distsched_app.clock import FakeClock
from distsched_app.models import Leader, Run, RunState
from distsched_app.services import figures
from distsched_app.services.leader_chores import (
    REPORT_EVERY_SECONDS,
    RETENTION_IDLE_SECONDS,
    FigureRefresher,
    Leadership,
)
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


# -- the stored figures' thread (issue 21): a figure takes up to 1.8 s at 11M runs; the tick never waits for it


class Beats:
    """An injected ``figures.refresh``: counts its calls (in any thread) and may block until released."""

    def __init__(self, *, block: bool = False) -> None:
        self.calls: list[tuple[object, str]] = []
        self.called = threading.Event()
        self.release = threading.Event()
        if not block:
            self.release.set()

    def __call__(self, now) -> None:
        self.calls.append((now, threading.current_thread().name))
        self.called.set()
        assert self.release.wait(10), "never released"


def test_the_figures_thread_refreshes_only_while_its_process_leads():
    beats = Beats()
    asked = threading.Semaphore(0)
    leads = [False]

    def leading() -> bool:
        asked.release()
        return leads[0]

    refresher = FigureRefresher(leading=leading, now=lambda: T0, refresh=beats, every=0.001)
    refresher.start()
    try:
        for _ in range(5):  # asked five times, while not leading: no refresh
            assert asked.acquire(timeout=10)
        assert beats.calls == []
        leads[0] = True
        assert beats.called.wait(10)
    finally:
        assert refresher.stop()
    assert beats.calls[0] == (T0, "distsched-figures")


def test_a_failed_refresh_is_logged_and_the_thread_goes_on(caplog):
    outcomes = iter([RuntimeError("boom")])
    done = threading.Event()

    def refresh(now) -> None:
        failure = next(outcomes, None)
        if failure is not None:
            raise failure
        done.set()

    refresher = FigureRefresher(leading=lambda: True, now=lambda: T0, refresh=refresh, every=0.001)
    with caplog.at_level(logging.WARNING, logger="distsched"):
        refresher.start()
        try:
            assert done.wait(10)  # the beat after the failure
        finally:
            assert refresher.stop()
    [line] = [r.distsched for r in caplog.records if r.getMessage() == "stored figure refresh failed; trying again"]
    assert line["error"] == "RuntimeError: boom"


def test_the_tick_does_not_wait_for_a_figure_being_computed(make_schedule, mono, monkeypatch):
    """With ``figures_clock`` (``tick --loop``, ``runworker --with-tick``) the turn ticks and returns
    while a figure is still being computed in the figures' thread; the turn never computes one."""

    def inline_refresh(now) -> None:
        raise AssertionError("a figure refreshed on the tick's path")

    monkeypatch.setattr(figures, "refresh", inline_refresh)
    a = Leadership(holder="a", lease_seconds=15, monotonic=mono.read, figures_clock=lambda: T0)
    assert a.figures is not None
    slow = Beats(block=True)
    a.figures.refresh, a.figures.every = slow, 0.001
    make_schedule("due", interval_seconds=60, start_at=T0 - timedelta(minutes=1))
    try:
        assert a.turn(T0) is not None
        assert slow.called.wait(10)  # the thread is inside a figure now
        make_schedule("due-too", interval_seconds=60, start_at=T0 - timedelta(minutes=1))
        created = a.turn(T0)  # ticks although the figure has not finished
        assert created is not None and [r.schedule_name for r in created] == ["due-too"]
        assert len(slow.calls) == 1 and not slow.release.is_set()
    finally:
        slow.release.set()
        a.stop()
    assert a.figures._thread is None  # stopped and joined
    assert Run.objects.count() == 2


def test_a_standby_refreshes_no_figure(mono):
    """The thread starts at the first turn that leads; a standby's turn starts none, and a thread
    whose process no longer leads only asks (``test_the_figures_thread_refreshes_only_while_its_process_leads``)."""
    a = leadership("a", mono)
    assert a.turn(T0) == []
    b = Leadership(holder="b", lease_seconds=15, monotonic=mono.read, figures_clock=lambda: T0)
    assert b.figures is not None
    assert b.turn(T0) is None
    assert b.figures._thread is None
    assert b.figures.leading() is False  # what the thread asks: the elector's answer
    b.stop()


def test_retention_with_a_backlog_goes_on_at_the_next_turn_then_looks_once_a_minute(
    make_schedule, mono, settings, monkeypatch
):
    """With old runs left, the leader calls retention again at its next turn (no rest); once a
    call finds nothing more, the next comes a minute later."""
    from distsched_app.services import retention

    settings.DISTSCHED = {"RETENTION": {"succeeded": "7d"}}
    sched = make_schedule("s1", start_at=T0 + DAY)
    for _ in range(3):
        make_run(sched, RunState.SUCCEEDED, finished_at=T0 - 8 * DAY)
    calls = []

    def one_batch_taking_two_seconds(self, now, *, fence, budget_seconds=0.5):
        calls.append(mono.read())
        mono.advance(2)
        return retention.RetentionPass(runs=1, events=2, batches=1, more=len(calls) < 3)

    monkeypatch.setattr(retention.Retention, "apply", one_batch_taking_two_seconds)
    a = leadership("a", mono)
    a.turn(T0)
    a.turn(T0)
    assert len(calls) == 2  # a backlog: the next turn went on
    a.turn(T0)  # the third call finds nothing more: once a minute from now on
    a.turn(T0)
    assert len(calls) == 3
    assert a.next_retention - mono.read() == pytest.approx(RETENTION_IDLE_SECONDS)
