"""The run list's filters: the right rows, and each one a walk of its own index, newest first
(issue 21: a filter on a rare or unknown value used to walk the whole table)."""

from __future__ import annotations

import pytest
from django.db import connection

from distsched_app.models import Origin, Run
from distsched_app.services import queries, run_filters
from distsched_app.services.enqueue import Job, enqueue

pytestmark = pytest.mark.django_db


@pytest.fixture
def runs(api_clock, scheduler, make_schedule):
    make_schedule("a", task_name="tests.echo", queue="fast")
    make_schedule("b", task_name="tests.noop")
    scheduler.tick()
    make_schedule("idle", task_name="tests.noop")  # after the tick: no run
    manual = scheduler.trigger("b")
    now = api_clock.now()
    high = enqueue(Job(task_name="tests.noop", priority=5, queue="fast"), now=now).run
    low = enqueue(Job(task_name="tests.echo", priority=-3), now=now).run
    make_schedule("gone", task_name="tests.noop")
    gone = scheduler.trigger("gone")
    scheduler.delete_schedule("gone")
    return {
        "a": Run.objects.get(schedule__name="a"),
        "b": Run.objects.get(schedule__name="b", origin=Origin.SCHEDULE),
        "manual": manual,
        "high": high,
        "low": low,
        "gone": gone,
    }


def ids(api, query: str) -> list[int]:
    response = api.get(f"/api/runs?{query}")
    assert response.status_code == 200, response.json()
    return [r["id"] for r in response.json()["results"]]


def test_each_filter_lists_its_runs_newest_first(api, runs):
    r = {k: v.pk for k, v in runs.items()}
    assert ids(api, "origin=enqueued") == [r["low"], r["high"]]
    assert ids(api, "origin=manual") == [r["gone"], r["manual"]]
    assert ids(api, "origin=schedule") == [r["b"], r["a"]]
    assert ids(api, "priority=5") == [r["high"]]
    assert ids(api, "priority=-3") == [r["low"]]
    assert ids(api, "priority=0") == [r["gone"], r["manual"], r["b"], r["a"]]
    assert ids(api, "priority=7") == []
    assert ids(api, "task_name=tests.echo") == [r["low"], r["a"]]
    assert ids(api, "task_name=tests.unknown") == []
    assert ids(api, "queue=fast") == [r["high"], r["a"]]
    assert ids(api, "queue=nowhere") == []
    assert ids(api, "schedule=b") == [r["manual"], r["b"]]
    assert ids(api, "queue=fast&origin=enqueued") == [r["high"]]


def test_an_unknown_or_idle_schedule_is_an_empty_page(api, runs):
    for name in ("nope", "idle"):
        response = api.get(f"/api/runs?schedule={name}")
        assert response.status_code == 200
        assert response.json()["results"] == []
        assert response.json()["next"] is None


def test_a_deleted_schedule_name_lists_the_runs_it_left(api, runs):
    """The runs outlive their schedule (issue 20): its name still finds them."""
    assert ids(api, "schedule=gone") == [runs["gone"].pk]


def test_the_bulk_filter_matches_what_the_list_shows(runs):
    def matched(data: dict) -> list[int]:
        q = run_filters.to_q(run_filters.clean(data))
        return list(Run.objects.filter(q).order_by("-id").values_list("id", flat=True))

    assert matched({"schedule": "b"}) == [runs["manual"].pk, runs["b"].pk]
    assert matched({"schedule": "gone"}) == [runs["gone"].pk]
    assert matched({"schedule": "nope"}) == []
    assert matched({"priority": 5}) == [runs["high"].pk]
    assert matched({"origin": "enqueued", "queue": "fast"}) == [runs["high"].pk]


def plan(qs) -> str:
    sql, params = qs.query.sql_with_params()
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # A ten-row table whose statistics earlier tests may have left (a seed in CI): the planner
            # would read it all, or sort a bitmap scan's rows. At ten million runs neither is cheaper
            # than the ordered walk; these make the tiny table cost like a large one.
            for kind in ("seqscan", "bitmapscan", "sort"):
                cursor.execute(f"SET LOCAL enable_{kind} = off")
            cursor.execute(f"EXPLAIN {sql}", params)
        else:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
        return "\n".join(str(row) for row in cursor.fetchall())


@pytest.mark.parametrize(
    ("condition", "index"),
    [
        (lambda: {"task_name": "tests.echo"}, "distsched_run_task_id"),
        (lambda: {"queue": "fast"}, "distsched_run_queue_id"),
        (lambda: {"origin": "manual"}, "distsched_run_origin_id"),
        (lambda: queries.priority_q(5), "distsched_run_prio_id"),
        (lambda: queries.schedule_runs_q("b"), "distsched_run_sched_id"),
        (lambda: queries.schedule_runs_q("nope"), "distsched_run_deleted_sched"),
    ],
)
def test_each_filter_walks_its_own_index(runs, condition, index):
    """Newest first along the filter's index: a page costs the same at ten million runs,
    whether the value is common, rare or unknown."""
    where = condition()
    qs = queries.runs().filter(**where) if isinstance(where, dict) else queries.runs().filter(where)
    found = plan(qs.order_by("-id")[:51])
    assert index in found
    if connection.vendor == "postgresql":
        assert "Sort" not in found  # the index gives the order (sorting is priced out above)
