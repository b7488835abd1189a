"""Pinned query counts: admin list pages cost the same whatever the number of rows on the page.

Every request pays 2 queries for the session and the user. The run list then
pays 3 for its filter choices (task names, queues, schedule names: all read
from the small schedules table; origins and priority bands are fixed), 1 COUNT
and 1 SELECT with the schedule joined (an outer join: half the runs below are
enqueued, without a schedule, and cost no query of their own).
On PostgreSQL an unfiltered list first asks the planner for its row estimate
(1 more query); below 100 000 rows it still counts exactly.
"""

from __future__ import annotations

import pytest
from django.urls import reverse

from distsched_app.admin.lists import LargeTablePaginator
from distsched_app.models import Run
from distsched_app.services import enqueue as enqueue_service
from distsched_app.services import workers
from tests.conftest import is_postgres

pytestmark = pytest.mark.django_db

SESSION = 2  # session row + user row


def estimate_probe() -> int:
    return 1 if is_postgres() else 0


def make_runs(scheduler, make_schedule, n: int, schedules: int = 5, enqueued: bool = True) -> None:
    """n runs: triggered runs of the schedules and (with ``enqueued``) as many enqueued runs without one."""
    names = [make_schedule(f"s{i}").name for i in range(schedules)]
    for i in range(n):
        if enqueued and i % 2:
            job = enqueue_service.Job(task_name="tests.noop", priority=i % 7, unique_key=f"key-{i}")
            enqueue_service.enqueue(job, now=scheduler.now())
        else:
            scheduler.trigger(names[i % schedules])


SCHEDULES_URL = reverse("admin:distsched_app_schedule_changelist")


@pytest.mark.parametrize("n", [5, 50])
def test_run_changelist_query_count_does_not_grow_with_rows(
    staff, scheduler, make_schedule, n, django_assert_num_queries
):
    make_runs(scheduler, make_schedule, n)
    with django_assert_num_queries(SESSION + 5 + estimate_probe()):
        response = staff.get(reverse("admin:distsched_app_run_changelist"))
    assert response.status_code == 200
    assert len(response.context["cl"].result_list) == n


@pytest.mark.parametrize("n", [5, 50])
def test_filtered_and_searched_run_changelist_query_count(
    staff, scheduler, make_schedule, n, django_assert_num_queries
):
    make_runs(scheduler, make_schedule, n)
    with django_assert_num_queries(SESSION + 5):
        response = staff.get(
            reverse("admin:distsched_app_run_changelist"), {"state": "pending", "queue": "default", "q": "manual:"}
        )
    assert len(response.context["cl"].result_list) == (n + 1) // 2  # the triggered half
    with django_assert_num_queries(SESSION + 5):
        response = staff.get(
            reverse("admin:distsched_app_run_changelist"), {"origin": "enqueued", "priority": "high", "q": "enqueued:"}
        )
    assert len(response.context["cl"].result_list) == len([i for i in range(1, n, 2) if i % 7])


@pytest.mark.parametrize("n", [5, 50])
def test_run_list_does_not_load_payloads_or_errors(staff, scheduler, make_schedule, n, django_assert_num_queries):
    make_runs(scheduler, make_schedule, n)
    response = staff.get(reverse("admin:distsched_app_run_changelist"))
    run = response.context["cl"].result_list[0]
    assert {"args", "kwargs", "last_error", "result"} <= run.get_deferred_fields()


@pytest.mark.parametrize("n", [5, 50])
def test_schedule_changelist_query_count(staff, scheduler, make_schedule, n, django_assert_num_queries):
    make_runs(scheduler, make_schedule, n, schedules=n)
    # 2 COUNTs (filtered, full), 1 SELECT with the last run as a subquery, 2 filter choices (queue, task).
    with django_assert_num_queries(SESSION + 5):
        response = staff.get(reverse("admin:distsched_app_schedule_changelist"))
    assert len(response.context["cl"].result_list) == n


@pytest.mark.parametrize("n", [5, 50])
def test_event_changelist_query_count(staff, scheduler, make_schedule, n, django_assert_num_queries):
    make_runs(scheduler, make_schedule, n)
    with django_assert_num_queries(SESSION + 2 + estimate_probe()):
        response = staff.get(reverse("admin:distsched_app_runevent_changelist"))
    assert len(response.context["cl"].result_list) == n


@pytest.mark.parametrize("n", [5, 50])
def test_worker_changelist_query_count(staff, clock, n, django_assert_num_queries):
    for i in range(n):
        workers.register_worker(worker_id=f"w{i}", hostname="h", pid=i, queues=[], now=clock.now())
    with django_assert_num_queries(SESSION + 4):  # the list's three, and the leader row (named above the list)
        response = staff.get(reverse("admin:distsched_app_worker_changelist"))
    assert len(response.context["cl"].result_list) == n


@pytest.mark.parametrize("origin", ["manual", "enqueued"])
def test_run_change_page_query_count(staff, scheduler, make_schedule, django_assert_num_queries, origin):
    make_runs(scheduler, make_schedule, 2)
    url = reverse("admin:distsched_app_run_change", args=[Run.objects.get(origin=origin).pk])
    staff.get(url)  # warms the content-type cache used by the "history" link
    # the run with its schedule (if any), then its events for the inline, then its queue's pause (read
    # once for the field and "Why is it waiting?"), then the live workers serving its queue (a due run
    # nobody serves says so); the retry policy needs nothing more
    with django_assert_num_queries(SESSION + 4):
        assert staff.get(url).status_code == 200


def test_dashboard_query_count_does_not_grow_with_runs(staff, scheduler, make_schedule, django_assert_num_queries):
    make_runs(scheduler, make_schedule, 30)
    # + the last hour's finished runs (slowest tasks) and their count per queue (the queues page's figure,
    # services.queue_stats.last_hour), + lookups of stored figures (services.figures): the stats', the
    # last hour's and the chart's (its closed hours, the open hour and the hour that closed last, each
    # looked up, then counted when not stored: on a small installation nothing is)
    with django_assert_num_queries(SESSION + 19):
        assert staff.get(reverse("admin:distsched_dashboard")).status_code == 200


@pytest.mark.postgres
def test_paginator_uses_the_planner_estimate_for_a_big_unfiltered_table(scheduler, make_schedule, monkeypatch):
    make_runs(scheduler, make_schedule, 3)
    monkeypatch.setattr(LargeTablePaginator, "_estimate", staticmethod(lambda qs: 2_000_000))
    assert LargeTablePaginator(Run.objects.all(), 50).count == 2_000_000
    assert LargeTablePaginator(Run.objects.filter(state="pending"), 50).count == 3  # filtered: exact
    monkeypatch.setattr(LargeTablePaginator, "_estimate", staticmethod(lambda qs: 10))
    assert LargeTablePaginator(Run.objects.all(), 50).count == 3  # small: exact


@pytest.mark.parametrize("n", [2, 8])
def test_queues_page_query_count_does_not_grow_with_queues(staff, clock, django_assert_num_queries, n):
    from distsched_app.services.enqueue import Job, enqueue

    for i in range(n):
        enqueue(Job(task_name="tests.noop", queue=f"q{i}"), now=clock.now())
    # depth, pauses, the stored figures' lookup (services.figures), the last hour's runs and their
    # count, oldest waiting, alive workers
    with django_assert_num_queries(SESSION + 7):
        assert staff.get(reverse("admin:distsched_queues")).status_code == 200


@pytest.mark.parametrize("n", [3, 12])
def test_schedule_changelist_query_count_does_not_grow_with_schedules(
    staff, scheduler, make_schedule, django_assert_num_queries, n
):
    for i in range(n):
        make_schedule(f"s{i}", interval_seconds=60)
    scheduler.tick()
    staff.get(SCHEDULES_URL)  # warm caches
    # the count and the page (its health columns are subqueries of the one page query), the filter choices
    with django_assert_num_queries(SESSION + 5):
        assert staff.get(SCHEDULES_URL).status_code == 200


@pytest.mark.postgres
def test_paginator_counts_a_filtered_list_up_to_a_cap_then_estimates(scheduler, make_schedule, monkeypatch):
    """At ten million runs an exact count of the dead ones took over a second: past
    ``filtered_exact_up_to`` the planner's estimate of the filter stands in."""
    from distsched_app.db import server

    make_runs(scheduler, make_schedule, 3)
    monkeypatch.setattr(server, "query_estimate", lambda qs: 777)
    assert LargeTablePaginator(Run.objects.filter(state="pending"), 50).count == 3  # under the cap: exact
    monkeypatch.setattr(LargeTablePaginator, "filtered_exact_up_to", 2)
    assert LargeTablePaginator(Run.objects.filter(state="pending"), 50).count == 777


def test_paginator_counts_exactly_on_sqlite_or_small_tables(scheduler, make_schedule):
    make_runs(scheduler, make_schedule, 3)
    assert LargeTablePaginator(Run.objects.all(), 50).count == 3
