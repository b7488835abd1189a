"""Stored operator figures (``services.figures``): computed once, read by every process while young."""

from __future__ import annotations

from datetime import timedelta

import pytest

from distsched_app.models import StoredFigure
from distsched_app.services import figures
from distsched_app.services.enqueue import Job, enqueue
from tests.conftest import T0

pytestmark = pytest.mark.django_db


class Counter:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, now):
        self.calls += 1
        return {"calls": self.calls, "at": now}


def test_a_quick_figure_is_computed_at_every_read_and_never_stored():
    compute = Counter()
    assert figures.memo("quick", T0, compute)["calls"] == 1
    assert figures.memo("quick", T0, compute)["calls"] == 2
    assert not StoredFigure.objects.exists()


def test_a_slow_figure_is_stored_read_while_young_and_computed_again_when_old(monkeypatch):
    monkeypatch.setattr(figures, "SLOW_SECONDS", 0.0)
    compute = Counter()
    assert figures.memo("slow", T0, compute) == {"calls": 1, "at": T0}
    assert figures.memo("slow", T0 + timedelta(seconds=29), compute) == {"calls": 1, "at": T0}
    assert compute.calls == 1
    later = T0 + timedelta(seconds=figures.MAX_AGE_SECONDS)
    assert figures.memo("slow", later, compute) == {"calls": 2, "at": later}
    row = StoredFigure.objects.get(key="slow")
    assert row.computed_at == later and row.seconds >= 0


def test_a_figure_from_the_future_is_not_trusted(monkeypatch):
    """A clock set back (or another process's clock ahead) must not freeze a figure."""
    monkeypatch.setattr(figures, "SLOW_SECONDS", 0.0)
    compute = Counter()
    figures.memo("f", T0, compute)
    assert figures.memo("f", T0 - timedelta(seconds=1), compute)["calls"] == 2


def test_a_figure_that_became_quick_is_forgotten(monkeypatch):
    monkeypatch.setattr(figures, "SLOW_SECONDS", 0.0)
    compute = Counter()
    figures.memo("f", T0, compute)
    monkeypatch.setattr(figures, "SLOW_SECONDS", 60.0)
    figures.memo("f", T0 + timedelta(minutes=1), compute)
    assert not StoredFigure.objects.filter(key="f").exists()


def test_refresh_recomputes_the_stalest_registered_figure_only(monkeypatch):
    monkeypatch.setattr(figures, "SLOW_SECONDS", 0.0)
    monkeypatch.setattr(figures, "_REGISTRY", {})
    old, young = Counter(), Counter()
    figures.register("old", old)
    figures.register("young", young)
    figures.memo("old", T0, old)
    figures.memo("young", T0 + timedelta(seconds=10), young)
    now = T0 + timedelta(seconds=figures.REFRESH_AFTER_SECONDS + 1)
    assert figures.refresh(now) == "old"
    assert (old.calls, young.calls) == (2, 1)
    assert StoredFigure.objects.get(key="old").computed_at == now
    assert figures.refresh(now) is None  # "young" is 6 s old: not due yet


def test_the_leader_refreshes_figures_among_its_chores(monkeypatch, clock):
    from distsched_app.services import leader_chores

    monkeypatch.setattr(figures, "SLOW_SECONDS", 0.0)
    monkeypatch.setattr(figures, "_REGISTRY", {})
    compute = Counter()
    figures.register("f", compute)
    figures.memo("f", clock.now() - timedelta(minutes=1), compute)
    leadership = leader_chores.Leadership(holder="me", monotonic=lambda: 1000.0)
    leadership.turn(clock.now())
    assert compute.calls == 2
    assert StoredFigure.objects.get(key="f").computed_at == clock.now()


def test_closed_hours_of_the_chart_are_stored_once_and_the_open_hour_is_refreshed(monkeypatch, clock, scheduler):
    """Deliberate change (issue 21): the dashboard's chart reads each closed hour once (kept two
    days), and the open hour is a figure the leader refreshes; the counts stay those of the history."""
    from distsched_app.services import stats

    monkeypatch.setattr(figures, "SLOW_SECONDS", 0.0)
    run = enqueue(Job(task_name="tests.noop"), now=clock.now()).run
    scheduler.cancel_run(run.pk)  # a cancelled event now
    hours = stats.outcomes_per_hour(now=clock.now())
    assert hours[-1].counts["cancelled"] == 1 and sum(h.total for h in hours[:-1]) == 0
    keys = set(StoredFigure.objects.values_list("key", flat=True))
    assert stats.OPEN_HOUR_FIGURE in keys and len([k for k in keys if k.startswith("dashboard:outcomes-hour:")]) == 23
    clock.advance(seconds=3600)
    later = stats.outcomes_per_hour(now=clock.now())
    assert later[-2].counts["cancelled"] == 1  # the hour that closed, computed afresh for its own key
    assert later[-1].counts["cancelled"] == 0  # the stored open hour belonged to the previous hour
