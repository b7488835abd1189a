"""REST API: /api/queues (list with depth and pauses), pause, resume; the run detail's queue pause."""

from __future__ import annotations

import pytest

from distsched_app.models import QueueEvent, QueuePause
from distsched_app.services import claiming, queues
from distsched_app.services.enqueue import Job, enqueue
from tests.conftest import T0

pytestmark = pytest.mark.django_db

NOW = "2026-03-02T09:00:00Z"


def run_in(queue: str, clock):
    return enqueue(Job(task_name="tests.noop", queue=queue), now=clock.now()).run


def test_pause_records_the_request_user_and_the_reason(api, api_clock):
    response = api.post("/api/queues/reports/pause", {"reason": "vendor outage"})
    assert response.status_code == 200, response.content
    assert response.json() == {
        "queue": "reports",
        "paused": True,
        "changed": True,
        "pause": {"paused_at": NOW, "paused_by": "user:operator", "reason": "vendor outage"},
    }
    pause = QueuePause.objects.get()
    assert (pause.queue, pause.paused_by, pause.reason, pause.paused_at) == (
        "reports",
        "user:operator",
        "vendor outage",
        T0,
    )


def test_pause_needs_no_body_and_a_second_pause_changes_nothing(api, api_clock, make_api_user, token_client):
    assert api.post("/api/queues/reports/pause").json()["pause"]["reason"] == ""
    other = token_client(make_api_user("bob", perms=["change_queuepause"]))
    again = other.post("/api/queues/reports/pause", {"reason": "mine"})
    assert again.status_code == 200
    assert again.json()["changed"] is False
    assert again.json()["pause"]["paused_by"] == "user:operator"  # the first pause holds
    assert QueueEvent.objects.count() == 1


def test_resume_answers_with_the_pause_it_lifted(api, api_clock):
    api.post("/api/queues/reports/pause", {"reason": "vendor outage"})
    response = api.post("/api/queues/reports/resume")
    assert response.status_code == 200
    body = response.json()
    assert (body["paused"], body["changed"], body["pause"]["reason"]) == (False, True, "vendor outage")
    assert not QueuePause.objects.exists()
    assert list(QueueEvent.objects.order_by("id").values_list("action", "actor")) == [
        ("pause", "user:operator"),
        ("resume", "user:operator"),
    ]
    again = api.post("/api/queues/reports/resume").json()
    assert (again["changed"], again["pause"]) == (False, None)


@pytest.mark.parametrize("name", ["bad%20name", "x" * 101, "semi;colon", "caf%C3%A9"])
def test_a_bad_name_is_400_and_writes_nothing(api, api_clock, name):
    for verb in ("pause", "resume"):
        response = api.post(f"/api/queues/{name}/{verb}")
        assert response.status_code == 400, response.content
        assert list(response.json()) == ["queue"]
    assert not QueuePause.objects.exists() and not QueueEvent.objects.exists()


@pytest.mark.parametrize(
    "body", [{"reason": 5}, {"reason": None}, {"reason": "x" * (queues.MAX_REASON + 1)}, ["reason"]]
)
def test_a_bad_body_is_400_and_writes_nothing(api, api_clock, body):
    response = api.post("/api/queues/reports/pause", body, format="json")
    assert response.status_code == 400, response.content
    assert not QueuePause.objects.exists()


def test_a_reason_the_database_cannot_store_is_400(api, api_clock):
    response = api.post("/api/queues/reports/pause", {"reason": "nul\x00"})
    assert response.status_code == 400
    assert not QueuePause.objects.exists()


def test_list_shows_depth_by_state_and_who_paused_when_and_why(api, api_clock):
    run_in("default", api_clock)
    run_in("reports", api_clock)
    run_in("reports", api_clock)
    claiming.claim_next_run(worker_id="w1", queues=["reports"], lease_seconds=30, now=api_clock.now())
    queues.pause_queue("reports", now=api_clock.now(), by="cli:ops", reason="vendor outage")
    queues.pause_queue("idle", now=api_clock.now(), by="user:alice")
    response = api.get("/api/queues")
    assert response.status_code == 200
    shown = [{k: row[k] for k in ("queue", "paused", "runs", "pause")} for row in response.json()]
    assert shown == [
        {
            "queue": "default",
            "paused": False,
            "runs": {"pending": 1, "retrying": 0, "blocked": 0, "leased": 0, "running": 0},
            "pause": None,
        },
        {
            "queue": "idle",
            "paused": True,
            "runs": {"pending": 0, "retrying": 0, "blocked": 0, "leased": 0, "running": 0},
            "pause": {"paused_at": NOW, "paused_by": "user:alice", "reason": ""},
        },
        {
            "queue": "reports",
            "paused": True,
            "runs": {"pending": 1, "retrying": 0, "blocked": 0, "leased": 0, "running": 1},
            "pause": {"paused_at": NOW, "paused_by": "cli:ops", "reason": "vendor outage"},
        },
    ]


def test_list_query_count_does_not_grow_with_queues(api, api_clock, django_assert_num_queries):
    for i in range(5):
        run_in(f"q{i}", api_clock)
        queues.pause_queue(f"q{i}", now=api_clock.now(), by="code:tests")
    # token and user, user and group permissions; the counts, the pauses, the last hour's runs and their
    # count per queue (after the lookup of the stored figures, services.figures), the oldest waiting runs,
    # the alive workers
    with django_assert_num_queries(10):
        assert len(api.get("/api/queues").json()) == 5


def test_the_run_detail_says_when_its_queue_is_paused(api, api_clock):
    run = run_in("reports", api_clock)
    assert api.get(f"/api/runs/{run.pk}").json()["queue_pause"] is None
    queues.pause_queue("reports", now=api_clock.now(), by="user:alice", reason="vendor outage")
    body = api.get(f"/api/runs/{run.pk}").json()
    assert body["queue_pause"] == {"paused_at": NOW, "paused_by": "user:alice", "reason": "vendor outage"}
    assert "queue_pause" not in api.get("/api/runs").json()["results"][0]  # the detail only: no query per row


def test_a_paused_queues_runs_wait_and_run_after_a_resume_through_the_api(api, api_clock):
    run = run_in("reports", api_clock)
    api.post("/api/queues/reports/pause")
    assert claiming.claim_next_run(worker_id="w1", queues=None, lease_seconds=30, now=api_clock.now()) is None
    api.post("/api/queues/reports/resume")
    claimed = claiming.claim_next_run(worker_id="w1", queues=None, lease_seconds=30, now=api_clock.now())
    assert claimed.pk == run.pk


def test_the_schema_documents_the_queue_endpoints(api):
    paths = api.get("/api/schema?format=json").json()["paths"]
    assert {"/api/queues/", "/api/queues/{name}/pause/", "/api/queues/{name}/resume/"} <= set(paths)
    pause = paths["/api/queues/{name}/pause/"]["post"]
    assert {"200", "400", "401", "403"} <= set(pause["responses"])
    assert "reason" in str(pause["requestBody"])
