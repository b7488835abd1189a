"""REST API: /api/workflows (enqueue, list, detail with nodes, cancel): 201, 400, 404, 409."""

from __future__ import annotations

import pytest

from distsched_app.models import Run, Workflow

pytestmark = pytest.mark.django_db

SPEC = {
    "name": "onboard",
    "nodes": [
        {"id": "fetch", "task": "tests.noop"},
        {"id": "bill", "task": "tests.noop", "after": ["fetch"]},
        {"id": "mail", "task": "tests.noop", "after": ["fetch"], "queue": "mail"},
    ],
}


def test_round_trip_enqueue_list_detail_cancel(api):
    created = api.post("/api/workflows", SPEC)
    assert created.status_code == 201, created.content
    body = created.json()
    assert set(body["runs"]) == {"fetch", "bill", "mail"}
    assert Run.objects.get(pk=body["runs"]["mail"]).queue == "mail"

    listed = api.get("/api/workflows/", {"state": "running", "name": "onboard"}).json()["results"]
    assert [w["id"] for w in listed] == [body["id"]]
    assert api.get("/api/workflows", {"name": "other"}).json()["results"] == []

    detail = api.get(f"/api/workflows/{body['id']}").json()
    assert detail["name"] == "onboard" and detail["state"] == "running" and detail["created_by"] == "user:operator"
    nodes = {n["id"]: n for n in detail["nodes"]}
    assert nodes["fetch"] == {**nodes["fetch"], "run": body["runs"]["fetch"], "state": "pending", "after": []}
    assert nodes["bill"]["state"] == "blocked" and nodes["bill"]["after"] == ["fetch"]

    cancelled = api.post(f"/api/workflows/{body['id']}/cancel", {"reason": "test"})
    assert cancelled.status_code == 200, cancelled.content
    assert cancelled.json()["state"] == "cancelled"
    assert {n["state"] for n in cancelled.json()["nodes"]} == {"cancelled"}
    again = api.post(f"/api/workflows/{body['id']}/cancel")
    assert again.status_code == 409


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"name": "x", "nodes": []}, "nodes"),
        ({"name": "x", "nodes": [{"id": "a", "task": "tests.noop", "after": ["b"]}]}, "nodes.0.after"),
        ({"name": "x", "nodes": [{"id": "a", "task": "no.such.task"}]}, "nodes.0.task"),
        ({"nodes": [{"id": "a", "task": "tests.noop"}]}, "name"),
        (["not", "an", "object"], "non_field_errors"),
    ],
)
def test_an_invalid_spec_is_a_400_with_field_messages_and_writes_nothing(api, spec, field):
    response = api.post("/api/workflows", spec)
    assert response.status_code == 400, response.content
    assert field in response.json()
    assert not Workflow.objects.exists() and not Run.objects.exists()


@pytest.mark.parametrize("query", [{"state": "nope"}, {"state": ""}, {"name": "a\x00b"}])
def test_a_bad_filter_is_a_400(api, query):
    response = api.get("/api/workflows", query)
    assert response.status_code == 400, response.content
    assert set(response.json()) == set(query)


@pytest.mark.parametrize("path", ["/api/workflows/999", "/api/workflows/abc", "/api/workflows/999/cancel"])
def test_an_unknown_workflow_is_a_404(api, path):
    response = api.post(path) if path.endswith("cancel") else api.get(path)
    assert response.status_code == 404


def test_permissions_are_the_workflow_models(make_api_user, token_client, api_clock):
    reader = token_client(make_api_user("reader", perms=["view_workflow"]))
    assert reader.get("/api/workflows").status_code == 200
    assert reader.post("/api/workflows", SPEC).status_code == 403
    assert token_client().get("/api/workflows").status_code == 401
