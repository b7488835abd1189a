"""REST API: POST /api/runs/bulk (dry run, 202 with the job), GET /api/runs/bulk/{id}, 400s, permissions."""

from __future__ import annotations

import pytest

from distsched_app.models import AuditEntry, BulkAction, BulkState, Run, RunState
from distsched_app.services import bulk
from tests.bulk_factories import make_runs

pytestmark = pytest.mark.django_db


def test_dry_run_answers_the_count_and_writes_nothing(api, api_clock):
    make_runs(4, now=api_clock.now(), queue="reports")
    make_runs(2, now=api_clock.now(), queue="emails")
    response = api.post(
        "/api/runs/bulk", {"filter": {"state": "dead", "queue": "reports"}, "action": "requeue", "dry_run": True}
    )
    assert response.status_code == 200, response.content
    assert response.json() == {
        "action": "requeue",
        "filter": {"state": "dead", "queue": "reports"},
        "dry_run": True,
        "count": 4,
    }
    assert not BulkAction.objects.exists() and not AuditEntry.objects.exists()


def test_post_creates_a_job_and_answers_202_before_acting(api, api_clock):
    ids = make_runs(3, now=api_clock.now())
    response = api.post("/api/runs/bulk", {"filter": {"state": "dead"}, "action": "requeue", "reason": "vendor back"})
    assert response.status_code == 202, response.content
    body = response.json()
    job = BulkAction.objects.get()
    assert body["id"] == job.pk and body["url"] == f"/api/runs/bulk/{job.pk}" == response["Location"]
    assert (body["state"], body["matched"], body["done"], body["progress"]) == ("pending", 3, 0, 0.0)
    assert (body["actor"], body["source"], body["reason"]) == ("user:operator", "api", "vendor back")
    assert set(Run.objects.filter(pk__in=ids).values_list("state", flat=True)) == {RunState.DEAD}  # not yet
    bulk.process_bulk_actions(api_clock)
    followed = api.get(body["url"]).json()
    assert (followed["state"], followed["done"], followed["skipped"], followed["progress"]) == ("done", 3, 0, 1.0)
    assert set(Run.objects.filter(pk__in=ids).values_list("state", flat=True)) == {RunState.PENDING}
    assert api.get("/api/runs/bulk").json()["results"][0]["id"] == job.pk


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"filter": {"colour": "red"}, "action": "requeue"}, "filter.colour"),
        ({"filter": {"state": "nope"}, "action": "cancel"}, "filter.state"),
        ({"filter": {"state": "succeeded"}, "action": "requeue"}, "filter.state"),
        ({"filter": {"priority": "high"}, "action": "requeue"}, "filter.priority"),
        ({"filter": {"created_after": "last week"}, "action": "requeue", "dry_run": True}, "filter.created_after"),
        ({"filter": "state=dead", "action": "requeue"}, "filter"),
        ({"filter": {}, "action": "delete"}, "action"),
        ({"filter": {}}, "action"),
        ({"filter": {}, "action": "requeue", "dry_run": "yes"}, "dry_run"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(api, api_clock, body, field):
    response = api.post("/api/runs/bulk", body)
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert not BulkAction.objects.exists()


def test_unknown_job_is_a_404(api, api_clock):
    for path in ("/api/runs/bulk/999999", "/api/runs/bulk/x", "/api/runs/bulk/99999999999999999999999"):
        response = api.get(path)
        assert response.status_code == 404, (path, response.content)


def test_creating_needs_change_run_and_reading_view_run(api_clock, make_api_user, token_client):
    reader = token_client(make_api_user("reader", perms=["view_run"]))
    assert reader.post("/api/runs/bulk", {"action": "requeue", "dry_run": True}).status_code == 403
    assert reader.get("/api/runs/bulk").status_code == 200
    nobody = token_client(make_api_user("nobody"))
    assert nobody.get("/api/runs/bulk").status_code == 403


def test_the_run_detail_routes_still_work(api, api_clock):
    [run] = make_runs(1, now=api_clock.now())
    assert api.get(f"/api/runs/{run}").status_code == 200
    assert api.post(f"/api/runs/{run}/requeue").status_code == 200
    job = bulk.create_bulk_action(action="cancel", filter={}, now=api_clock.now())
    assert job.state == BulkState.PENDING and job.matched == 1  # the requeued run is pending now


def test_cancel_stops_a_job_and_is_a_409_once_it_ended(api, api_clock):
    make_runs(3, now=api_clock.now())
    job = api.post("/api/runs/bulk", {"filter": {"state": "dead"}, "action": "requeue"}).json()
    stopped = api.post(f"{job['url']}/cancel", {"reason": "wrong filter"})
    assert stopped.status_code == 200, stopped.content
    assert (stopped.json()["state"], stopped.json()["done"]) == ("cancelled", 0)
    assert api.post(f"{job['url']}/cancel").status_code == 409
    assert api.post("/api/runs/bulk/999999/cancel").status_code == 404
    assert set(Run.objects.values_list("state", flat=True)) == {RunState.DEAD}
