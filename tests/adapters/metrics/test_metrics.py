"""``GET /metrics``: Prometheus text computed from the database, protected like the API."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.authtoken.models import Token

from distsched_app.models import EventType, Origin, Run, RunState, Schedule, WorkerStatus
from distsched_app.services import events, queues, workers
from tests.conftest import T0

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fake_time(clock):
    """Scrapes read the test's FakeClock (installed by the ``clock`` fixture)."""
    return clock


@pytest.fixture
def scraper(db):
    """A user holding the metrics permission, and no other (not staff: it needs no admin login)."""
    user = get_user_model().objects.create_user("ops", password="pw")
    user.user_permissions.add(Permission.objects.get(codename="view_metrics", content_type__app_label="distsched_app"))
    return user


@pytest.fixture
def public(settings):
    settings.DISTSCHED = {"METRICS_PUBLIC": True}


def parse(response) -> tuple[dict, dict]:
    """(family name -> type, (sample name, sorted labels) -> value)."""
    types, values = {}, {}
    for family in text_string_to_metric_families(response.content.decode()):
        types[family.name] = family.type
        for s in family.samples:
            values[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return types, values


def sample(values: dict, name: str, **labels: str) -> float:
    return values[(name, tuple(sorted(labels.items())))]


# --------------------------------------------------------------------------- auth


def test_anonymous_is_401_with_a_token_challenge(client):
    response = client.get("/metrics")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"
    assert response["Content-Type"].startswith("text/plain")
    assert response.content.decode().count("\n") == 1
    assert b"distsched_" not in response.content


def test_users_without_the_metrics_permission_are_refused(client):
    everything_else = Permission.objects.filter(content_type__app_label="distsched_app").exclude(
        codename="view_metrics"
    )
    user = get_user_model().objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(*everything_else)
    client.force_login(user)
    assert client.get("/metrics").status_code == 403


def test_metrics_permission_by_session_and_token(client, scraper):
    client.force_login(scraper)
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"] == CONTENT_TYPE_LATEST
    assert "distsched_runs" in parse(response)[0]
    client.logout()
    token = Token.objects.create(user=scraper)
    assert client.get("/metrics/", HTTP_AUTHORIZATION=f"Token {token.key}").status_code == 200
    response = client.get("/metrics", HTTP_AUTHORIZATION="Token not-a-token")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"


def test_superusers_may_scrape(client, django_user_model):
    client.force_login(django_user_model.objects.create_superuser("root", password="pw"))
    assert client.get("/metrics").status_code == 200


def test_public_metrics_need_no_credentials(client, public):
    assert client.get("/metrics").status_code == 200
    # A stale credential on the scraper does not break a public endpoint.
    response = client.get("/metrics", HTTP_AUTHORIZATION="Token not-a-token")
    assert response.status_code == 200
    assert response["Content-Type"] == CONTENT_TYPE_LATEST


def test_any_accept_header_gets_prometheus_text(client, public):
    for accept in ("application/json", "application/openmetrics-text; version=1.0.0", "text/html"):
        response = client.get("/metrics", HTTP_ACCEPT=accept)
        assert response.status_code == 200, accept
        assert response["Content-Type"] == CONTENT_TYPE_LATEST


def test_only_get_and_head(client, scraper):
    client.force_login(scraper)
    assert client.head("/metrics").status_code == 200
    assert client.post("/metrics").status_code == 405
    client.logout()
    assert client.post("/metrics").status_code == 401


# ------------------------------------------------------------------------ content


def make_run(schedule, state, *, queue="default", scheduled_for, available_at=None, started_at=None, finished_at=None):
    return Run.objects.create(
        schedule=schedule,
        task_name=schedule.task_name,
        state=state,
        queue=queue,
        scheduled_for=scheduled_for,
        available_at=available_at or scheduled_for,
        started_at=started_at,
        finished_at=finished_at,
        origin=Origin.MANUAL,
        idempotency_key="k",
        created_at=scheduled_for,
        updated_at=scheduled_for,
    )


@pytest.fixture
def world(make_schedule, scheduler, clock, settings):
    """Schedules overdue by 5 minutes, runs with known timings, failure events, three workers."""
    settings.DISTSCHED = {"METRICS_PUBLIC": True, "STALE_AFTER_SECONDS": 30, "MISFIRE_GRACE_SECONDS": 60}
    clock.set(T0 - timedelta(minutes=5))
    a = make_schedule("a")
    make_schedule("b", queue="q2")
    make_schedule("p")
    scheduler.pause("p")
    clock.set(T0)
    s, m = timedelta(seconds=1), timedelta(minutes=1)
    # In the last hour: durations 0.3s and 4s (default), 20s (q2); lags 2s, 40s, 0.05s; claim 2s, 10s, 0.05s.
    make_run(
        a,
        RunState.SUCCEEDED,
        scheduled_for=T0 - 10 * m,
        started_at=T0 - 10 * m + 2 * s,
        finished_at=T0 - 10 * m + 2.3 * s,
    )
    make_run(
        a,
        RunState.SUCCEEDED,
        scheduled_for=T0 - 20 * m,
        available_at=T0 - 20 * m + 30 * s,
        started_at=T0 - 20 * m + 40 * s,
        finished_at=T0 - 20 * m + 44 * s,
    )
    make_run(
        a,
        RunState.DEAD,
        queue="q2",
        scheduled_for=T0 - 5 * m,
        started_at=T0 - 5 * m + 0.05 * s,
        finished_at=T0 - 5 * m + 20.05 * s,
    )
    # Finished too long ago for the timings, but counted in the totals.
    make_run(a, RunState.SUCCEEDED, scheduled_for=T0 - 120 * m, started_at=T0 - 120 * m, finished_at=T0 - 119 * m)
    # Not succeeded/dead: no timing.
    make_run(a, RunState.CANCELLED, scheduled_for=T0 - 3 * m, started_at=T0 - 3 * m, finished_at=T0 - 2 * m)
    # Waiting: due for 90s (default) and 30s (q2); one not due yet; one running.
    waiting = make_run(a, RunState.PENDING, scheduled_for=T0 - 90 * s)
    make_run(a, RunState.PENDING, scheduled_for=T0 + 60 * s)
    make_run(a, RunState.RETRYING, queue="q2", scheduled_for=T0 - 10 * m, available_at=T0 - 30 * s)
    make_run(a, RunState.RUNNING, scheduled_for=T0 - m, started_at=T0 - m)
    recent, old = T0 - 10 * m, T0 - 120 * m
    events.record_many(
        [
            events.NewEvent(run_id=waiting.pk, event_type=kind, now=at)
            for kind, at, n in (
                (EventType.FAILED, recent, 2),
                (EventType.FAILED, old, 1),
                (EventType.RETRY_SCHEDULED, recent, 2),
                (EventType.MARKED_DEAD, old, 1),
                (EventType.LEASE_EXPIRED, recent, 1),
                (EventType.SUCCEEDED, recent, 4),
                (EventType.SUCCEEDED, old, 5),
                (EventType.CREATED, recent, 3),
            )
            for _ in range(n)
        ]
    )
    for wid, beat, status in (
        ("w-alive", T0 - 5 * s, WorkerStatus.ACTIVE),
        ("w-stale", T0 - 60 * s, WorkerStatus.STOPPING),
        ("w-stopped", T0 - 60 * s, WorkerStatus.STOPPED),
    ):
        workers.register_worker(worker_id=wid, hostname="h", pid=1, queues=["default"], now=beat)
        workers.heartbeat(worker_id=wid, now=beat, status=status, clock_skew_seconds=0.25)
    return a


def test_runs_by_state_and_queue_and_totals(client, world):
    types, values = parse(client.get("/metrics"))
    assert types["distsched_runs"] == "gauge"
    expected = {
        ("succeeded", "default"): 3,
        ("cancelled", "default"): 1,
        ("pending", "default"): 2,
        ("running", "default"): 1,
        ("dead", "q2"): 1,
        ("retrying", "q2"): 1,
    }
    for queue in ("default", "q2"):
        for state in RunState.values:
            # Every run of the world is manual: the other origins are zero, not missing.
            assert sample(values, "distsched_runs", state=state, queue=queue, origin="manual") == expected.get(
                (state, queue), 0
            )
            assert sample(values, "distsched_runs", state=state, queue=queue, origin="schedule") == 0
            assert sample(values, "distsched_runs", state=state, queue=queue, origin="enqueued") == 0
    assert types["distsched_runs_succeeded"] == types["distsched_runs_dead"] == "counter"
    assert sample(values, "distsched_runs_succeeded_total", queue="default") == 3
    assert sample(values, "distsched_runs_succeeded_total", queue="q2") == 0
    assert sample(values, "distsched_runs_dead_total") == 1
    assert sample(values, "distsched_run_failures_total") == 3
    assert sample(values, "distsched_run_retries_total") == 2
    assert sample(values, "distsched_leases_expired_total") == 1
    assert types["distsched_run_events_last_hour"] == "gauge"
    recent = {
        dict(labels)["event_type"]: v for (n, labels), v in values.items() if n == "distsched_run_events_last_hour"
    }
    assert recent == {
        "marked_dead": 0,
        "failed": 2,
        "retry_scheduled": 2,
        "lease_expired": 1,
        "succeeded": 4,
        "cancelled": 0,
        "skipped": 0,
        "lease_lost": 0,
    }
    assert sample(values, "distsched_oldest_waiting_run_age_seconds", queue="default") == 90
    assert sample(values, "distsched_oldest_waiting_run_age_seconds", queue="q2") == 30


def runs_samples(values: dict) -> dict[tuple[str, str, str], float]:
    """``distsched_runs`` as (state, queue, origin) -> value."""
    return {
        (dict(labels)["state"], dict(labels)["queue"], dict(labels)["origin"]): v
        for (name, labels), v in values.items()
        if name == "distsched_runs"
    }


@pytest.fixture
def mixed_origins(scheduler, make_schedule, clock, public):
    """Runs of every origin: ticked and triggered runs of two schedules, enqueued runs, some finished."""
    from distsched_app.services import enqueue as enqueue_service

    make_schedule("s", queue="default")
    make_schedule("t", queue="q2")
    ticked = scheduler.tick()
    scheduler.trigger("s")
    scheduler.cancel_run(scheduler.trigger("t").pk)
    for job in (
        enqueue_service.Job(task_name="tests.noop"),
        enqueue_service.Job(task_name="tests.noop", queue="q2", priority=5),
        enqueue_service.Job(task_name="tests.noop", queue="q3"),
    ):
        enqueue_service.enqueue(job, now=clock.now())
    worker = scheduler.worker(worker_id="w1", queues=["default"], heartbeat_seconds=3600)
    while worker.run_once() is not None:  # the default queue's runs of every origin succeed
        pass
    return ticked


def test_runs_by_origin_add_up_to_the_totals_by_state_and_queue(client, mixed_origins):
    _, values = parse(client.get("/metrics"))
    by_origin = runs_samples(values)
    assert {k: v for k, v in by_origin.items() if v} == {
        ("succeeded", "default", "schedule"): 1,
        ("succeeded", "default", "manual"): 1,
        ("succeeded", "default", "enqueued"): 1,
        ("pending", "q2", "schedule"): 1,
        ("cancelled", "q2", "manual"): 1,
        ("pending", "q2", "enqueued"): 1,
        ("pending", "q3", "enqueued"): 1,
    }
    # Every (state, queue, origin) is a series, zeros included; summed over origins they are the
    # old (state, queue) figures, which are the rows of the table.
    queues = {"default", "q2", "q3"}
    assert set(by_origin) == {(s, q, o) for s in RunState.values for q in queues for o in Origin.values}
    for queue in queues:
        for state in RunState.values:
            total = sum(by_origin[(state, queue, origin)] for origin in Origin.values)
            assert total == Run.objects.filter(state=state, queue=queue).count(), (state, queue)
    assert sum(by_origin.values()) == Run.objects.count() == 7
    assert sample(values, "distsched_runs_succeeded_total", queue="default") == 3  # over every origin


def test_every_surface_shows_the_same_run_totals(client, mixed_origins, admin_client):
    """/metrics, /api/stats, `distsched stats` and the admin dashboard: one set of figures."""
    import json
    from io import StringIO

    from django.core.management import call_command
    from django.urls import reverse

    _, values = parse(client.get("/metrics"))
    from_metrics = dict.fromkeys(RunState.values, 0)
    for (state, _, _), v in runs_samples(values).items():
        from_metrics[state] += int(v)
    from_table = {state: Run.objects.filter(state=state).count() for state in RunState.values}
    assert from_metrics == from_table
    out = StringIO()
    call_command("distsched", "stats", "--json", stdout=out)
    assert json.loads(out.getvalue())["runs_by_state"] == from_table
    from distsched_app.services.stats import stats

    assert stats(now=T0).runs_by_state == from_table
    dashboard = admin_client.get(reverse("admin:distsched_dashboard"))
    assert {s["state"]: s["count"] for s in dashboard.context["states"]} == from_table
    assert dashboard.context["runs_total"] == 7


def test_timing_histograms_over_the_last_hour(client, world):
    types, values = parse(client.get("/metrics"))
    assert types["distsched_run_duration_seconds"] == "histogram"

    def buckets(name, queue):
        return {
            float(dict(labels)["le"]): v
            for (n, labels), v in values.items()
            if n == f"{name}_bucket" and dict(labels)["queue"] == queue
        }

    duration = buckets("distsched_run_duration_seconds", "default")
    assert (duration[0.1], duration[0.5], duration[2.5], duration[5.0], duration[float("inf")]) == (0, 1, 1, 2, 2)
    assert sample(values, "distsched_run_duration_seconds_gcount", queue="default") == 2
    assert sample(values, "distsched_run_duration_seconds_gsum", queue="default") == pytest.approx(4.3)
    q2 = buckets("distsched_run_duration_seconds", "q2")
    assert (q2[10.0], q2[30.0], q2[float("inf")]) == (0, 1, 1)
    assert sample(values, "distsched_run_duration_seconds_gsum", queue="q2") == pytest.approx(20)
    lag = buckets("distsched_run_start_lag_seconds", "default")
    assert (lag[1.0], lag[2.5], lag[30.0], lag[60.0]) == (0, 1, 1, 2)
    assert sample(values, "distsched_run_start_lag_seconds_gsum", queue="default") == pytest.approx(42)
    claim = buckets("distsched_run_claim_latency_seconds", "default")
    assert (claim[1.0], claim[2.5], claim[5.0], claim[10.0]) == (0, 1, 1, 2)
    assert sample(values, "distsched_run_claim_latency_seconds_gsum", queue="default") == pytest.approx(12)
    assert buckets("distsched_run_claim_latency_seconds", "q2")[0.1] == 1


def test_workers_and_schedules(client, world):
    _, values = parse(client.get("/metrics"))
    assert sample(values, "distsched_workers", state="alive") == 1
    assert sample(values, "distsched_workers", state="stale") == 1
    assert sample(values, "distsched_workers", state="stopped") == 1
    assert sample(values, "distsched_worker_heartbeat_age_seconds", worker_id="w-alive", status="active") == 5
    assert sample(values, "distsched_worker_heartbeat_age_seconds", worker_id="w-stale", status="stopping") == 60
    assert not [k for k in values if ("worker_id", "w-stopped") in k[1]]  # stopped workers drop out
    assert sample(values, "distsched_worker_clock_skew_seconds", worker_id="w-alive") == 0.25
    assert sample(values, "distsched_schedules", state="active") == 2
    assert sample(values, "distsched_schedules", state="paused") == 1
    assert sample(values, "distsched_schedules_overdue") == 2
    assert sample(values, "distsched_schedule_max_overdue_seconds") == 300


def test_an_empty_database_scrapes_zeros(client, public):
    _, values = parse(client.get("/metrics"))
    assert sample(values, "distsched_runs", state="pending", queue="default", origin="enqueued") == 0
    assert sample(values, "distsched_schedules_overdue") == 0
    assert sample(values, "distsched_schedule_max_overdue_seconds") == 0
    assert sample(values, "distsched_workers", state="alive") == 0


def test_overdue_clears_when_a_tick_runs(client, world, scheduler):
    scheduler.tick()
    _, values = parse(client.get("/metrics"))
    assert sample(values, "distsched_schedules_overdue") == 0
    assert Schedule.objects.filter(paused=False, next_run_at__gt=T0).count() == 2


def test_query_count_is_fixed(client, world, django_assert_num_queries, make_schedule, clock):
    # the snapshot's ten, the lookup of its stored figures (services.figures), workflows by state, the leader row
    with django_assert_num_queries(13):
        client.get("/metrics")
    # More rows of every kind: still thirteen queries.
    for i in range(5):
        queues.pause_queue(f"q{i}", now=clock.now(), by="code:tests")
        make_schedule(f"more-{i}", queue=f"q{i}")
        workers.register_worker(worker_id=f"extra-{i}", hostname="h", pid=1, queues=[], now=clock.now())
        make_run(
            world,
            RunState.SUCCEEDED,
            queue=f"q{i}",
            scheduled_for=T0 - timedelta(minutes=1),
            started_at=T0 - timedelta(minutes=1),
            finished_at=T0,
        )
    with django_assert_num_queries(13):
        response = client.get("/metrics")
    assert sample(parse(response)[1], "distsched_runs_succeeded_total", queue="q4") == 1
    assert sample(parse(response)[1], "distsched_queue_paused", queue="q4") == 1


def test_a_paused_queue_is_a_gauge_of_one_until_it_is_resumed(client, world, clock):
    def paused(values: dict) -> dict:
        return {labels: v for (name, labels), v in values.items() if name == "distsched_queue_paused"}

    types, values = parse(client.get("/metrics"))
    assert types["distsched_queue_paused"] == "gauge"
    assert paused(values) == {}, "no queue is paused: no series"
    queues.pause_queue("reports", now=clock.now(), by="user:alice", reason="vendor outage")
    queues.pause_queue("default", now=clock.now(), by="code:tests")
    assert paused(parse(client.get("/metrics"))[1]) == {(("queue", "default"),): 1, (("queue", "reports"),): 1}
    queues.resume_queue("reports", now=clock.now(), by="user:alice")
    assert paused(parse(client.get("/metrics"))[1]) == {(("queue", "default"),): 1}
