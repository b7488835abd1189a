"""``GET /api/queues`` figures and ``GET /api/runs?kwargs__<key>=<value>`` (time-bounded, 400 on hostile input)."""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import urlencode

import pytest

from distsched_app.models import Run, RunState
from distsched_app.services import workers
from distsched_app.services.enqueue import Job, enqueue

pytestmark = pytest.mark.django_db


def finished(queue: str, *, lag: float, ended) -> Run:
    started = ended - timedelta(seconds=1)
    scheduled = started - timedelta(seconds=lag)
    run = enqueue(Job(task_name="tests.noop", queue=queue), now=scheduled).run
    Run.objects.filter(pk=run.pk).update(state=RunState.SUCCEEDED, started_at=started, finished_at=ended, attempts=1)
    return run


def test_queue_figures(api, api_clock):
    now = api_clock.now()
    for lag in (1, 2, 3, 4):
        finished("reports", lag=lag, ended=now - timedelta(minutes=lag))
    enqueue(Job(task_name="tests.noop", queue="reports"), now=now - timedelta(seconds=90))
    workers.register_worker(worker_id="w1", hostname="h", pid=1, queues=[], now=now)
    [row] = api.get("/api/queues").json()
    assert row["queue"] == "reports" and row["runs"]["pending"] == 1
    assert row["oldest_waiting_seconds"] == 90.0
    assert row["start_lag"] == {"count": 4, "p50_seconds": 2.0, "p95_seconds": 4.0, "max_seconds": 4.0}
    assert (row["finished_last_hour"], row["workers"], row["limits"]) == (4, ["w1"], [])
    assert row["throughput_per_minute"] == pytest.approx(4 / 60)


def test_runs_by_kwarg(api, api_clock):
    now = api_clock.now()
    match = enqueue(Job(task_name="tests.echo", kwargs={"account_id": 42}), now=now).run
    enqueue(Job(task_name="tests.echo", kwargs={"account_id": "42"}), now=now)
    old = enqueue(Job(task_name="tests.echo", kwargs={"account_id": 42}), now=now - timedelta(days=30)).run
    ids = [r["id"] for r in api.get("/api/runs?kwargs__account_id=42").json()["results"]]
    assert ids == [match.pk]
    assert api.get("/api/runs?kwargs__account_id=43").json()["results"] == []
    since = urlencode({"since": (now - timedelta(days=31)).isoformat()})
    ids = [r["id"] for r in api.get(f"/api/runs?kwargs__account_id=42&{since}").json()["results"]]
    assert ids == [old.pk, match.pk]  # newest first (by id)
    page = api.get(f"/api/runs?kwargs__account_id=42&{since}&page_size=1").json()
    assert [r["id"] for r in api.get(page["next"]).json()["results"]] == [match.pk]  # the cursor keeps the search


@pytest.mark.parametrize(
    "query",
    [
        "kwargs__a__contains=1",
        "kwargs__0=1",
        "kwargs__=1",
        "kwargs__a=%5B1%5D",
        "kwargs__a=null",
        "kwargs__a=1e999",
        f"kwargs__a={2**70}",
        "kwargs__a=%00",
        "kwargs__a%27%3B--=1",
        "kwargs__a=1&since=yesterday",
        "kwargs__a=1&until=2026-03-01T00:00:00",
        "since=0001-01-01T00:00:00%2B05:00",  # no UTC date (SQLite stores UTC)
        "until=9999-12-31T23:59:59-05:00",
    ],
)
def test_hostile_kwargs_searches_are_400(api, query):
    response = api.get(f"/api/runs?{query}")
    assert response.status_code == 400, response.content
    assert isinstance(response.json(), dict)
