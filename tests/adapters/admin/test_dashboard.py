"""The admin dashboard: state counts, workers, overdue schedules and the 24-hour SVG chart."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest
from django.urls import reverse

from distsched_app.admin.chart import build_chart, grid_steps, nice_ceiling
from distsched_app.models import Worker, WorkerStatus
from distsched_app.services import stats, workers
from distsched_app.services.stats import HourOutcomes
from tests.conftest import T0

pytestmark = pytest.mark.django_db

DASHBOARD = reverse("admin:distsched_dashboard")


@pytest.fixture
def history(scheduler, make_schedule, clock):
    """09:00 one success and one retry; 11:00 one death and one cancel; 11:10 a schedule is overdue."""
    make_schedule("ok", interval_seconds=3600)
    make_schedule("flaky", task_name="tests.fail", max_attempts=2, retry_base_seconds=60, interval_seconds=86400)
    scheduler.tick()
    worker = scheduler.worker(worker_id="w1", lease_seconds=30, heartbeat_seconds=3600)
    worker.run_once()
    worker.run_once()
    clock.advance(hours=2)
    [ok2] = scheduler.tick()
    assert worker.run_once().state == "dead"  # flaky's retry: the oldest available run
    scheduler.cancel_run(ok2.pk)
    make_schedule("late", interval_seconds=600)
    clock.advance(minutes=10)
    # Workers: one fresh, one silent for 5 minutes, one stopped.
    Worker.objects.all().delete()
    workers.register_worker(worker_id="fresh", hostname="h", pid=1, queues=[], now=clock.now())
    workers.register_worker(worker_id="silent", hostname="h", pid=2, queues=[], now=clock.now() - timedelta(minutes=5))
    workers.register_worker(worker_id="done", hostname="h", pid=3, queues=[], now=clock.now())
    workers.set_status(worker_id="done", status=WorkerStatus.STOPPED, now=clock.now())


def number(body: str, attribute: str) -> int:
    match = re.search(rf"{attribute}>(\d+)<", body)
    assert match, attribute
    return int(match.group(1))


def test_dashboard_renders_counts_and_svg_chart(staff, history):
    response = staff.get(DASHBOARD)
    assert response.status_code == 200
    body = response.content.decode()
    assert number(body, 'data-state="succeeded"') == 1
    assert number(body, 'data-state="dead"') == 1
    assert number(body, 'data-state="cancelled"') == 1
    assert number(body, 'data-state="pending"') == 0
    assert number(body, 'data-workers="alive"') == 1
    assert number(body, 'data-workers="stale"') == 1
    assert number(body, 'data-workers="stopped"') == 1
    assert number(body, 'data-schedules="total"') == 3
    assert number(body, 'data-schedules="overdue"') == 1
    assert number(body, 'data-recent="failures"') == 2
    assert number(body, 'data-recent="retries"') == 1
    # The overdue schedule is listed; the recent failure links to its run.
    overdue = body.split('id="distsched-overdue"')[1].split("</section>")[0]
    assert "late" in overdue and "ok" not in overdue
    # Inline SVG, no external asset: 24 hourly bars, the outcomes in the right hours.
    svg = body.split('<svg class="distsched-chart"', 1)[1].split("</svg>", 1)[0]
    assert svg.count('class="distsched-bar"') == 24
    assert "http" not in svg.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert 'data-hour="2026-03-02T09:00:00+00:00" data-total="2"' in svg
    assert 'data-hour="2026-03-02T11:00:00+00:00" data-total="2"' in svg
    assert 'data-hour="2026-03-02T10:00:00+00:00" data-total="0"' in svg
    assert svg.count("<rect") == 4
    for outcome in ("succeeded", "retried", "dead", "cancelled"):
        assert f'class="distsched-seg-{outcome}"' in svg
        assert number(body, f'data-outcome="{outcome}"') == 1


def test_dashboard_on_an_empty_database(staff):
    body = staff.get(DASHBOARD).content.decode()
    assert '<svg class="distsched-chart"' in body and "No attempt ended in the last 24 hours." in body
    assert number(body, 'data-schedules="overdue"') == 0


def test_dashboard_needs_the_view_permission_on_runs(client, django_user_model):
    user = django_user_model.objects.create_user("plain-staff", password="x", is_staff=True)
    client.force_login(user)
    assert client.get(DASHBOARD).status_code == 403


def test_admin_index_and_app_index_link_the_dashboard(staff):
    assert DASHBOARD in staff.get(reverse("admin:index")).content.decode()
    assert DASHBOARD in staff.get(reverse("admin:app_list", args=["distsched_app"])).content.decode()
    assert DASHBOARD in staff.get(reverse("admin:distsched_app_run_changelist")).content.decode()


def test_outcomes_per_hour_buckets_by_utc_hour(history, clock):
    hours = stats.outcomes_per_hour(now=clock.now())
    assert len(hours) == 24
    assert hours[-1].start == datetime(2026, 3, 2, 11, tzinfo=timezone.utc)
    assert hours[0].start == datetime(2026, 3, 1, 12, tzinfo=timezone.utc)
    by_hour = {h.start.hour: h.counts for h in hours if h.total}
    assert by_hour == {
        9: {"succeeded": 1, "retried": 1, "dead": 0, "cancelled": 0},
        11: {"succeeded": 0, "retried": 0, "dead": 1, "cancelled": 1},
    }


def test_outcomes_older_than_24_hours_are_left_out(history, clock):
    clock.advance(hours=23)  # now 10:10 next day: the 09:00 hour has left the window
    hours = stats.outcomes_per_hour(now=clock.now())
    assert sum(h.total for h in hours) == 2


def test_overdue_schedules(make_schedule, clock):
    make_schedule("late", interval_seconds=600)
    make_schedule("paused-late", interval_seconds=600, paused=True)
    assert stats.overdue_schedules(now=clock.now() + timedelta(seconds=30)) == []
    assert [s.name for s in stats.overdue_schedules(now=clock.now() + timedelta(seconds=61))] == ["late"]


@pytest.mark.parametrize(
    ("value", "ceiling"),
    [(0, 1), (1, 1), (2, 2), (3, 5), (7, 10), (11, 20), (20, 20), (21, 50), (99, 100), (101, 200), (4999, 5000)],
)
def test_nice_ceiling(value, ceiling):
    assert nice_ceiling(value) == ceiling


@pytest.mark.parametrize("ceiling", [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000])
def test_grid_steps_are_whole_numbers(ceiling):
    steps = grid_steps(ceiling)
    assert ceiling % steps == 0


def test_build_chart_stacks_segments_proportionally():
    start = T0.replace(minute=0)
    hours = [
        HourOutcomes(start=start + timedelta(hours=i), counts={"succeeded": 0, "retried": 0, "dead": 0, "cancelled": 0})
        for i in range(24)
    ]
    hours[5] = HourOutcomes(start=hours[5].start, counts={"succeeded": 6, "retried": 2, "dead": 1, "cancelled": 1})
    hours[6] = HourOutcomes(start=hours[6].start, counts={"succeeded": 5, "retried": 0, "dead": 0, "cancelled": 0})
    chart = build_chart(hours, width=760, height=260)
    plot = chart.plot_bottom - chart.plot_top
    bar = chart.bars[5]
    assert bar.total == 10 and [s.outcome for s in bar.segments] == ["succeeded", "retried", "dead", "cancelled"]
    assert sum(s.height for s in bar.segments) == pytest.approx(plot, abs=0.05)  # the peak fills the plot
    assert bar.segments[0].y + bar.segments[0].height == pytest.approx(chart.plot_bottom)
    for lower, upper in zip(bar.segments, bar.segments[1:], strict=False):
        assert upper.y + upper.height == pytest.approx(lower.y, abs=0.02)  # stacked, no gap
    assert chart.bars[6].segments[0].height == pytest.approx(plot / 2, abs=0.05)
    assert chart.bars[0].segments == ()
    assert [g.value for g in chart.grid] == [0, 2, 4, 6, 8, 10]
    assert {i.outcome: i.total for i in chart.legend} == {"succeeded": 11, "retried": 2, "dead": 1, "cancelled": 1}
    assert [b.label for b in chart.bars if b.label][:2] == ["09:00", "12:00"]
    assert chart.bars[-1].label == "08:00"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (-3, "0s"), (119, "119s"), (310, "5m 10s"), (7260, "2h 1m"), (86400, "24h 0m"), (200000, "2d 7h")],
)
def test_heartbeat_age_is_human_readable(seconds, text):
    from distsched_app.admin.display import age

    assert age(seconds) == text
