"""Queue names cannot blow /metrics up, and ``DISTSCHED["QUEUES"]`` refuses names outside a set.

Anyone allowed to enqueue may name a queue; every queue costs a few dozen
series. Past ``METRICS_MAX_QUEUES`` queues holding runs, only the queues an
operator made known (default, QUEUES, schedules', running workers') keep their
own series and the rest are summed into ``queue="(other)"``.
"""

from __future__ import annotations

import pytest
from django.core.checks import run_checks
from prometheus_client.parser import text_string_to_metric_families

from distsched_app.errors import ValidationError
from distsched_app.services import workers
from distsched_app.services.enqueue import Job, enqueue
from distsched_app.services.queue_labels import OTHER
from tests.conftest import T0

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def public(settings, clock):
    settings.DISTSCHED = {"METRICS_PUBLIC": True, "METRICS_MAX_QUEUES": 10}
    return settings


def scrape(client) -> tuple[int, dict[str, dict[str, float]]]:
    """(size in bytes, metric family -> queue label -> summed value) of one scrape."""
    response = client.get("/metrics")
    assert response.status_code == 200
    by_queue: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for s in family.samples:
            if "queue" in s.labels and not s.name.endswith(("_bucket", "_gcount", "_gsum")):
                into = by_queue.setdefault(s.name, {})
                into[s.labels["queue"]] = into.get(s.labels["queue"], 0) + s.value
    return len(response.content), by_queue


def test_few_queues_are_each_labelled(client):
    for i in range(5):
        enqueue(Job(task_name="tests.noop", queue=f"q{i}"), now=T0)
    _, by_queue = scrape(client)
    assert set(by_queue["distsched_runs"]) == {"default", "q0", "q1", "q2", "q3", "q4"}


def test_many_queues_fold_into_other_and_totals_stay_exact(client, make_schedule):
    make_schedule("nightly", queue="reports")  # a schedule's queue: known
    workers.register_worker(worker_id="w1", hostname="h", pid=1, queues=["io"], now=T0)  # a worker's: known
    for queue in ("reports", "io"):
        enqueue(Job(task_name="tests.noop", queue=queue), now=T0)
    small, _ = scrape(client)
    for i in range(300):
        enqueue(Job(task_name="tests.noop", queue=f"made-up-{i}"), now=T0)
    big, by_queue = scrape(client)
    runs = by_queue["distsched_runs"]
    assert set(runs) == {"default", "reports", "io", OTHER}
    assert runs[OTHER] == 300 and runs["reports"] == 1 and runs["io"] == 1
    assert set(by_queue["distsched_oldest_waiting_run_age_seconds"]) == set(runs)
    assert big < 2 * small  # 300 more queues cost the scrape one more series group, not 300


def test_known_queues_are_capped_too(client, settings, make_schedule):
    for i in range(30):
        make_schedule(f"s{i}", queue=f"sched-{i:02d}")
        enqueue(Job(task_name="tests.noop", queue=f"sched-{i:02d}"), now=T0)
    _, by_queue = scrape(client)
    runs = by_queue["distsched_runs"]
    assert len(runs) == 10 + 1 and "default" in runs and runs[OTHER] == 30 - 9
    assert sum(runs.values()) == 30


@pytest.fixture
def only_some_queues(settings):
    settings.DISTSCHED = {"QUEUES": ["default", "emails"]}


def test_a_configured_set_refuses_other_queues_everywhere(only_some_queues, scheduler, clock):
    enqueue(Job(task_name="tests.noop", queue="emails"), now=T0)
    with pytest.raises(ValidationError, match="not one of DISTSCHED") as refused:
        enqueue(Job(task_name="tests.noop", queue="emals"), now=T0)
    assert refused.value.field == "queue"
    with pytest.raises(ValidationError, match="not one of DISTSCHED"):
        scheduler.create_schedule(name="s", task_name="tests.noop", interval_seconds=60, queue="emals")
    with pytest.raises(ValidationError, match="not one of DISTSCHED"):
        scheduler.worker(queues=["emals"])


def test_a_configured_set_is_a_400_in_the_api(only_some_queues, api):
    response = api.post("/api/runs", {"task_name": "tests.noop", "queue": "emals"}, format="json")
    assert response.status_code == 400
    assert "queue" in str(response.json())


@pytest.mark.parametrize(
    "queues,message",
    [
        ([], "non-empty list"),
        ("default", "non-empty list"),
        (["default", "bad name"], "non-empty list"),
        (["emails"], "must include 'default'"),
    ],
)
def test_invalid_queue_sets_are_a_system_check_error(settings, queues, message):
    settings.DISTSCHED = {"QUEUES": queues}
    errors = [e for e in run_checks() if e.id == "distsched.E003"]
    assert errors and message in errors[0].msg


@pytest.mark.parametrize("value", [0, 10_001, "50"])
def test_the_metrics_cap_is_range_checked(settings, value):
    settings.DISTSCHED = {"METRICS_MAX_QUEUES": value}
    assert [e for e in run_checks() if "METRICS_MAX_QUEUES" in e.msg]
