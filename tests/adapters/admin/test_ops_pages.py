"""The operators' pages: the queues page (figures, pause/resume with a reason, permissions), the
run list's time and error columns, its sort by time and kwargs search, the schedule list's health
columns and the dashboard's slowest tasks."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.urls import reverse

from distsched_app.models import AuditEntry, QueuePause, Run, RunState
from distsched_app.services import queues, workers
from distsched_app.services.enqueue import Job, enqueue
from tests.adapters.admin.pages import RUNS, SCHEDULES, messages_of

pytestmark = pytest.mark.django_db

QUEUES = reverse("admin:distsched_queues")
DASHBOARD = reverse("admin:distsched_dashboard")


def queue_page(name: str) -> str:
    return reverse("admin:distsched_queue", args=[name])


def finished(queue: str, *, lag: float, took: float, ended, task="tests.noop", state=RunState.SUCCEEDED, error=""):
    started = ended - timedelta(seconds=took)
    scheduled = started - timedelta(seconds=lag)
    run = enqueue(Job(task_name=task, queue=queue, kwargs={"account_id": 42}), now=scheduled).run
    Run.objects.filter(pk=run.pk).update(
        state=state, started_at=started, finished_at=ended, attempts=1, last_error=error, available_at=scheduled
    )
    return run


@pytest.fixture
def busy_queue(clock):
    """reports: lags 1..20 s over the last hour, two waiting runs (the oldest 5 minutes), a worker, a pause."""
    now = clock.now()
    for i in range(1, 21):
        finished("reports", lag=i, took=0.25, ended=now - timedelta(minutes=i * 2))
    enqueue(Job(task_name="tests.noop", queue="reports"), now=now - timedelta(minutes=5))
    enqueue(Job(task_name="tests.noop", queue="reports"), now=now)
    workers.register_worker(worker_id="w-reports", hostname="h", pid=1, queues=["reports"], now=now)
    queues.pause_queue("reports", now=now, by="user:alice", reason="vendor outage")
    return now


def test_the_queues_page_shows_each_figure(staff, busy_queue):
    response = staff.get(QUEUES)
    assert response.status_code == 200
    body = response.content.decode()
    row = body.split('data-queue="reports"', 1)[1].split("</tr>", 1)[0]
    assert 'data-state="pending"><a' in row and ">2</a>" in row
    assert ">5 min 0 s<" in row  # oldest waiting
    assert ">10.0 s<" in row and ">19.0 s<" in row  # start lag p50, p95
    assert ">0.3<" in row  # 20 finished in 60 minutes
    assert "vendor outage" in row and "paused" in row
    assert 'id="distsched-refresh"' in body


def test_the_queue_page_pauses_with_a_reason_and_resumes(staff, busy_queue):
    page = staff.get(queue_page("reports"))
    assert page.status_code == 200
    body = page.content.decode()
    assert "w-reports" in body and "vendor outage" in body and 'id="distsched-queue-resume"' in body
    resumed = staff.post(reverse("admin:distsched_queue_resume", args=["reports"]), follow=True)
    assert ("success", "Resumed queue reports.") in messages_of(resumed)
    assert not QueuePause.objects.exists()
    paused = staff.post(reverse("admin:distsched_queue_pause", args=["reports"]), {"reason": "deploy"}, follow=True)
    assert ("success", "Paused queue reports.") in messages_of(paused)
    pause = QueuePause.objects.get()
    assert (pause.paused_by, pause.reason) == ("user:admin", "deploy")
    assert AuditEntry.objects.filter(target="reports", action="pause", source="admin").exists()
    assert staff.get(reverse("admin:distsched_queue_pause", args=["reports"])).status_code == 405


def test_queue_pages_refuse_unknown_names_and_readers_cannot_pause(client, django_user_model, staff, busy_queue):
    assert staff.get(queue_page("nothing-here")).status_code == 404
    assert staff.get(queue_page("bad name!")).status_code == 404
    from django.contrib.auth.models import Permission

    reader = django_user_model.objects.create_user("reader", password="pw", is_staff=True)
    reader.user_permissions.add(Permission.objects.get(codename="view_queuepause"))
    client.force_login(reader)
    assert client.get(QUEUES).status_code == 200
    assert 'id="distsched-queue-resume"' not in client.get(queue_page("reports")).content.decode()
    assert client.post(reverse("admin:distsched_queue_resume", args=["reports"])).status_code == 403
    assert QueuePause.objects.exists()
    nobody = django_user_model.objects.create_user("nobody", password="pw", is_staff=True)
    client.force_login(nobody)
    assert client.get(QUEUES).status_code == 403


def test_the_run_list_shows_started_duration_lag_and_the_errors_first_line(staff, clock):
    run = finished(
        "default",
        lag=0.012,
        took=1.5,
        ended=clock.now(),
        state=RunState.DEAD,
        error="ValueError: disk full\n\nTraceback (most recent call last):\n  secret frame",
    )
    body = staff.get(RUNS).content.decode()
    row = body.split(f">{run.pk}</a>", 1)[1].split("</tr>", 1)[0]
    assert "ValueError: disk full" in row and "Traceback" not in row
    assert ">1.50 s<" in row and ">12.0 ms<" in row
    assert (run.started_at or clock.now()).strftime("%H:%M") in row or "2026-03-02" in row
    assert 'id="distsched-refresh"' in body


def test_the_run_list_sorts_by_started(staff, clock):
    now = clock.now()
    early = finished("default", lag=0, took=1, ended=now - timedelta(hours=2))
    late = finished("default", lag=0, took=1, ended=now - timedelta(hours=1))
    response = staff.get(RUNS, {"o": "-10"})  # the tenth column: started
    assert response.status_code == 200
    shown = [r.pk for r in response.context["cl"].result_list]
    assert shown == [late.pk, early.pk]
    ascending = [r.pk for r in staff.get(RUNS, {"o": "10"}).context["cl"].result_list]
    assert ascending == [early.pk, late.pk]


def test_the_run_list_sorted_by_started_puts_the_unstarted_runs_after_the_newest(staff, clock):
    """Both databases the same way (SQLite's own order; PostgreSQL's NULLS FIRST for a descending
    sort used to list every unstarted run before the newest started one)."""
    now = clock.now()
    early = finished("default", lag=0, took=1, ended=now - timedelta(hours=2))
    late = finished("default", lag=0, took=1, ended=now - timedelta(hours=1))
    waiting = enqueue(Job(task_name="tests.noop"), now=now).run
    newest_first = [r.pk for r in staff.get(RUNS, {"o": "-10"}).context["cl"].result_list]
    assert newest_first == [late.pk, early.pk, waiting.pk]
    oldest_first = [r.pk for r in staff.get(RUNS, {"o": "10"}).context["cl"].result_list]
    assert oldest_first == [waiting.pk, early.pk, late.pk]


def sort_plan(qs) -> str:
    sql, params = qs.query.sql_with_params()
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL enable_seqscan = off")  # a few rows: the planner would read them all
            cursor.execute("SET LOCAL enable_bitmapscan = off")
            cursor.execute("SET LOCAL enable_sort = off")  # a plan that needs no sort wins if there is one
            cursor.execute(f"EXPLAIN {sql}", params)
        else:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
        return "\n".join(str(row) for row in cursor.fetchall())


@pytest.mark.parametrize("params", [{"o": "-10"}, {"o": "-10", "state": "dead"}])
def test_the_run_list_sorted_by_started_reads_its_page_along_the_index(staff, clock, params):
    """Issue 21: at 11M runs the dead runs newest started first took 0.9-2.8 s on PostgreSQL; the
    page's query now walks ``distsched_run_started_desc`` in its order and sorts nothing. (SQLite
    with a state filter and no statistics picks the state's index and sorts: not checked there.)"""
    if "state" in params and connection.vendor != "postgresql":
        pytest.skip("SQLite's planner choice for a filtered sort depends on ANALYZE statistics")
    finished("default", lag=0, took=1, ended=clock.now(), state=RunState.DEAD)
    enqueue(Job(task_name="tests.noop"), now=clock.now())
    cl = staff.get(RUNS, params).context["cl"]
    text = sort_plan(cl.queryset[:100])
    assert "distsched_run_started_desc" in text
    assert "Sort" not in text and "TEMP B-TREE" not in text


def test_the_run_list_searches_by_kwargs_within_the_default_window(staff, clock):
    now = clock.now()
    match = enqueue(Job(task_name="tests.echo", kwargs={"account_id": 42}), now=now).run
    enqueue(Job(task_name="tests.echo", kwargs={"account_id": "42"}), now=now)
    enqueue(Job(task_name="tests.echo", kwargs={"account_id": 42}), now=now - timedelta(days=30))
    response = staff.get(RUNS, {"kwargs__account_id": "42"})
    assert response.status_code == 200
    assert [r.pk for r in response.context["cl"].result_list] == [match.pk]
    assert "the last 24 hours" in response.content.decode()
    nothing = staff.get(RUNS, {"kwargs__account_id": "43"})
    assert list(nothing.context["cl"].result_list) == []
    wider = staff.get(RUNS, {"kwargs__account_id": "42", "since": "2026-01-01T00:00:00Z"})
    assert len(wider.context["cl"].result_list) == 2


@pytest.mark.parametrize(
    "params",
    [
        {"kwargs__a__contains": "1"},
        {"kwargs__0": "1"},
        {"kwargs__a": "[1]"},
        {"kwargs__a": "1", "since": "soon"},
        {"kwargs__a": "\x00"},
        {"kwargs__a\x00": "1"},
    ],
)
def test_a_hostile_kwargs_search_gets_the_invalid_lookup_page(staff, params):
    response = staff.get(RUNS, params)
    assert response.status_code == 302 and response["Location"].endswith("?e=1")


def test_the_schedule_list_shows_health_instead_of_a_red_cross(staff, scheduler, make_schedule, clock):
    make_schedule("flaky", task_name="tests.fail", max_attempts=1, interval_seconds=60)
    make_schedule("fine", interval_seconds=60)
    make_schedule("late", interval_seconds=60)
    worker = scheduler.worker(worker_id="w1", lease_seconds=30, heartbeat_seconds=3600)
    for _ in range(3):
        scheduler.tick()
        while worker.run_once() is not None:
            pass
        clock.advance(seconds=60)
    scheduler.tick()
    while worker.run_once() is not None:
        pass
    scheduler.pause("fine", reason="vendor outage")
    from distsched_app.models import Schedule

    Schedule.objects.filter(name="late").update(next_run_at=clock.now() - timedelta(hours=1))
    body = staff.get(SCHEDULES).content.decode()
    assert "icon-no.svg" not in body and "icon-yes.svg" not in body
    flaky = body.split(">flaky</a>", 1)[1].split("</tr>", 1)[0]
    assert "distsched-badge-failing'>4<" in flaky
    fine = body.split(">fine</a>", 1)[1].split("</tr>", 1)[0]
    assert "distsched-badge-paused" in fine and "vendor outage" in fine
    late = body.split(">late</a>", 1)[1].split("</tr>", 1)[0]
    assert "overdue 1 h 0 min" in late


def test_the_dashboard_times_tasks_slowest_first(staff, clock):
    now = clock.now()
    for took in (1, 2, 3):
        finished("default", task="tests.record", lag=0, took=took, ended=now - timedelta(minutes=took))
    finished("default", task="tests.echo", lag=0, took=0.004, ended=now, state=RunState.DEAD)
    body = staff.get(DASHBOARD).content.decode()
    section = body.split('id="distsched-task-timing"', 1)[1].split("</section>", 1)[0]
    assert section.index("tests.record") < section.index("tests.echo")
    record = section.split('data-task="tests.record"', 1)[1].split("</tr>", 1)[0]
    assert ">3<" in record and ">2.00 s<" in record and ">3.00 s<" in record
    echo = section.split('data-task="tests.echo"', 1)[1].split("</tr>", 1)[0]
    assert 'data-figure="failures">1<' in echo and ">4.00 ms<" in echo
    assert 'id="distsched-refresh"' in body


def test_a_kwargs_search_counts_at_most_the_cap_and_one_more(staff, clock, monkeypatch):
    from distsched_app.admin import run_search as admin_search

    monkeypatch.setattr(admin_search, "COUNT_CAP", 3)
    for _ in range(6):
        enqueue(Job(task_name="tests.echo", kwargs={"account_id": 42}), now=clock.now())
    response = staff.get(RUNS, {"kwargs__account_id": "42"})
    assert response.context["cl"].result_count == 4
    assert "Counted up to 3 runs." in response.content.decode()
    plain = staff.get(RUNS, {"task_name": "tests.echo"})
    assert plain.context["cl"].result_count == 6  # without a kwargs search: exact
