"""REST API and /metrics access: token and session auth; Django model permissions per action.

``test_permission_matrix`` walks every endpoint and method with every kind of
user and asserts the exact status, and for a refused write that nothing changed.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.authentication import SessionAuthentication, TokenAuthentication
from rest_framework.test import APIClient

from distsched_app import workflows
from distsched_app.metrics import MetricsView
from distsched_app.models import (
    AuditEntry,
    Limit,
    LimitEvent,
    QueueEvent,
    QueuePause,
    Run,
    RunEvent,
    Schedule,
    Workflow,
)
from distsched_app.services import bulk, limit_overrides, queues

pytestmark = pytest.mark.django_db

VIEW_ALL = ["view_schedule", "view_run", "view_worker", "view_queuepause", "view_limit", "view_workflow"]

# name -> make_api_user options (None: no credentials at all)
ROLES = {
    "anonymous": None,
    "no_perms": {"staff": True},
    "viewer": {"staff": True, "perms": VIEW_ALL},
    "viewer_not_staff": {"perms": VIEW_ALL},
    "schedule_viewer": {"staff": True, "perms": ["view_schedule"]},
    "changer": {
        "staff": True,
        "perms": [
            "change_schedule",
            "change_run",
            "change_worker",
            "change_queuepause",
            "change_limit",
            "change_workflow",
        ],
    },
    "adder": {"staff": True, "perms": ["add_schedule"]},
    "run_adder": {"perms": ["add_run"]},  # e.g. a service account that enqueues work
    "workflow_adder": {"perms": ["add_workflow"]},
    "deleter": {"staff": True, "perms": ["delete_schedule"]},
    "metrics": {"perms": ["view_metrics"]},
    "superuser": {"superuser": True},
}
AUTHENTICATED = set(ROLES) - {"anonymous"}
READ_SCHEDULES = {"viewer", "viewer_not_staff", "schedule_viewer", "changer", "superuser"}  # change implies view
READ_RUNS = {"viewer", "viewer_not_staff", "changer", "superuser"}
ANY_PERMISSION = AUTHENTICATED - {"no_perms"}


@dataclass(frozen=True)
class Endpoint:
    method: str
    url: str  # {run} / {cancelled}: the pending / the cancelled run's id
    allowed: set[str]  # roles that succeed
    ok: int  # their status
    body: dict | None = None
    writes: bool = False
    anonymous: int = 401


ENDPOINTS = {
    "schedules-list": Endpoint("get", "/api/schedules", READ_SCHEDULES, 200),
    "schedules-retrieve": Endpoint("get", "/api/schedules/s1", READ_SCHEDULES, 200),
    "schedules-create": Endpoint(
        "post",
        "/api/schedules",
        {"adder", "superuser"},
        201,
        body={"name": "s2", "task_name": "tests.noop", "interval_seconds": 60},
        writes=True,
    ),
    "schedules-patch": Endpoint(
        "patch", "/api/schedules/s1", {"changer", "superuser"}, 200, body={"max_attempts": 9}, writes=True
    ),
    "schedules-delete": Endpoint("delete", "/api/schedules/s1", {"deleter", "superuser"}, 204, writes=True),
    "schedules-pause": Endpoint("post", "/api/schedules/s1/pause", {"changer", "superuser"}, 200, writes=True),
    "schedules-resume": Endpoint("post", "/api/schedules/p1/resume", {"changer", "superuser"}, 200, writes=True),
    "schedules-trigger": Endpoint("post", "/api/schedules/s1/trigger", {"changer", "superuser"}, 201, writes=True),
    "schedules-history": Endpoint("get", "/api/schedules/s1/history", READ_SCHEDULES, 200),
    "schedules-restore": Endpoint(
        "post", "/api/schedules/s1/restore", {"changer", "superuser"}, 200, body={"version": 1}, writes=True
    ),
    "runs-list": Endpoint("get", "/api/runs", READ_RUNS, 200),
    "runs-create": Endpoint(
        "post", "/api/runs", {"run_adder", "superuser"}, 201, body={"task_name": "tests.noop"}, writes=True
    ),
    "runs-retrieve": Endpoint("get", "/api/runs/{run}", READ_RUNS, 200),
    "runs-events": Endpoint("get", "/api/runs/{run}/events", READ_RUNS, 200),
    "runs-explain": Endpoint("get", "/api/runs/{run}/explain", READ_RUNS, 200),
    "runs-cancel": Endpoint("post", "/api/runs/{run}/cancel", {"changer", "superuser"}, 200, writes=True),
    "runs-requeue": Endpoint("post", "/api/runs/{cancelled}/requeue", {"changer", "superuser"}, 200, writes=True),
    "workers": Endpoint("get", "/api/workers", READ_RUNS, 200),  # the same roles hold view/change_worker
    "stats": Endpoint("get", "/api/stats", READ_RUNS, 200),  # stats need what reading runs needs
    "queues-list": Endpoint("get", "/api/queues", READ_RUNS, 200),  # the same roles hold view/change_queuepause
    "queues-pause": Endpoint(
        "post", "/api/queues/reports/pause", {"changer", "superuser"}, 200, body={"reason": "r"}, writes=True
    ),
    "queues-resume": Endpoint("post", "/api/queues/held/resume", {"changer", "superuser"}, 200, writes=True),
    "limits-list": Endpoint("get", "/api/limits", READ_RUNS, 200),  # the same roles hold view/change_limit
    "limits-retrieve": Endpoint("get", "/api/limits/held", READ_RUNS, 200),
    "limits-patch": Endpoint(
        "patch", "/api/limits/held", {"changer", "superuser"}, 200, body={"concurrency": 2}, writes=True
    ),
    "limits-reset": Endpoint("post", "/api/limits/held/reset", {"changer", "superuser"}, 200, writes=True),
    "workflows-list": Endpoint("get", "/api/workflows", READ_RUNS, 200),
    "workflows-retrieve": Endpoint("get", "/api/workflows/{workflow}", READ_RUNS, 200),
    "workflows-create": Endpoint(
        "post",
        "/api/workflows",
        {"workflow_adder", "superuser"},
        201,
        body={"name": "w", "nodes": [{"id": "a", "task": "tests.noop"}]},
        writes=True,
    ),
    "workflows-cancel": Endpoint(
        "post", "/api/workflows/{workflow}/cancel", {"changer", "superuser"}, 200, writes=True
    ),
    "bulk-list": Endpoint("get", "/api/runs/bulk", READ_RUNS, 200),
    "bulk-retrieve": Endpoint("get", "/api/runs/bulk/{bulk}", READ_RUNS, 200),
    "bulk-create": Endpoint(
        "post",
        "/api/runs/bulk",
        {"changer", "superuser"},
        202,
        body={"filter": {"state": "cancelled"}, "action": "requeue"},
        writes=True,
    ),
    "bulk-cancel": Endpoint("post", "/api/runs/bulk/{bulk}/cancel", {"changer", "superuser"}, 200, writes=True),
    "schema": Endpoint("get", "/api/schema?format=json", ANY_PERMISSION, 200),
    "docs": Endpoint("get", "/api/docs", ANY_PERMISSION, 200, anonymous=302),
    "metrics": Endpoint("get", "/metrics", {"metrics", "superuser"}, 200),
}


@pytest.fixture
def world(api_clock, scheduler, make_schedule, monkeypatch, settings):
    """s1 with a pending run, p1 paused, a cancelled run of s1, queue "held" paused, limit "held" overridden;
    returns the runs' ids."""
    settings.DISTSCHED = {**settings.DISTSCHED, "LIMITS": {"held": {"queue": "held", "concurrency": 1}}}
    make_schedule("s1")
    make_schedule("p1")
    scheduler.pause("p1")
    queues.pause_queue("held", now=api_clock.now(), by="code:tests")
    limit_overrides.set_override("held", {"paused": True}, now=api_clock.now(), by="code:tests")
    [run] = scheduler.tick()
    cancelled = scheduler.cancel_run(scheduler.trigger("s1").pk)
    flow = workflows.enqueue({"name": "w1", "nodes": [{"id": "a", "task": "tests.noop"}]}, clock=api_clock)
    job = bulk.create_bulk_action(action="requeue", filter={"state": "cancelled"}, now=api_clock.now())
    return {"run": run.pk, "cancelled": cancelled.pk, "workflow": flow.id, "bulk": job.pk}


def snapshot() -> tuple:
    """Everything a write could change."""
    schedules = list(Schedule.objects.order_by("name").values_list("name", "max_attempts", "paused", "next_run_at"))
    runs = list(Run.objects.order_by("id").values_list("id", "state", "cancel_requested", "max_attempts"))
    pauses = list(QueuePause.objects.order_by("queue").values_list("queue", "paused_by", "reason"))
    limits = list(Limit.objects.order_by("name").values_list("name", "override", "override_by"))
    return (
        schedules,
        runs,
        RunEvent.objects.count(),
        pauses,
        QueueEvent.objects.count(),
        limits,
        LimitEvent.objects.count(),
        AuditEntry.objects.count(),
        list(Workflow.objects.order_by("id").values_list("id", "state")),
    )


def client_for(role: str, make_api_user, token_client) -> APIClient:
    options = ROLES[role]
    return token_client() if options is None else token_client(make_api_user(role, **options))


def call(client: APIClient, method: str, url: str, body: dict | None = None):
    return getattr(client, method)(url, body, format="json") if body is not None else getattr(client, method)(url)


@pytest.mark.parametrize("role", list(ROLES))
@pytest.mark.parametrize("name", list(ENDPOINTS))
def test_permission_matrix(world, make_api_user, token_client, name, role):
    endpoint = ENDPOINTS[name]
    client = client_for(role, make_api_user, token_client)
    before = snapshot()
    response = call(client, endpoint.method, endpoint.url.format(**world), endpoint.body)
    if role == "anonymous":
        expected = endpoint.anonymous
    else:
        expected = endpoint.ok if role in endpoint.allowed else 403
    assert response.status_code == expected, response.content
    if expected == 401:
        assert response["WWW-Authenticate"] == "Token"
    if expected == 302:
        assert response["Location"] == "/admin/login/?next=/api/docs"
    if expected in (401, 403) and name not in ("docs", "metrics"):
        assert set(response.json()) == {"detail"}
    if endpoint.writes:
        assert (snapshot() == before) == (expected != endpoint.ok), "a refused write changed something"


def routed_views() -> dict[type, set[tuple[str, str]]]:
    """Every DRF view in the URLconf -> its (method, action) pairs (HEAD aside: it is the GET)."""
    found: dict[type, set[tuple[str, str]]] = {}

    def walk(patterns):
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns)
            elif isinstance(pattern, URLPattern) and hasattr(pattern.callback, "cls"):
                actions = getattr(pattern.callback, "actions", None) or {"get": "get"}
                found.setdefault(pattern.callback.cls, set()).update(
                    (method, action) for method, action in actions.items() if method != "head"
                )

    walk(get_resolver().url_patterns)
    return found


def test_every_endpoint_of_the_api_is_in_the_matrix():
    """A new route cannot slip past the matrix: every routed action is listed above."""
    routes = {cls.__name__: actions for cls, actions in routed_views().items()}
    assert routes == {
        "ScheduleViewSet": {
            ("get", "list"),
            ("post", "create"),
            ("get", "retrieve"),
            ("patch", "partial_update"),
            ("delete", "destroy"),
            ("post", "pause"),
            ("post", "resume"),
            ("post", "trigger"),
            ("get", "history"),
            ("post", "restore"),
        },
        "RunViewSet": {
            ("get", "list"),
            ("post", "create"),
            ("get", "retrieve"),
            ("get", "events"),
            ("get", "explain"),
            ("post", "cancel"),
            ("post", "requeue"),
        },
        "WorkerViewSet": {("get", "list")},
        "QueueViewSet": {("get", "list"), ("post", "pause"), ("post", "resume")},
        "LimitViewSet": {("get", "list"), ("get", "retrieve"), ("patch", "partial_update"), ("post", "reset")},
        "WorkflowViewSet": {("get", "list"), ("get", "retrieve"), ("post", "create"), ("post", "cancel")},
        "BulkActionViewSet": {("get", "list"), ("get", "retrieve"), ("post", "create"), ("post", "cancel")},
        "StatsView": {("get", "get")},
        "SchemaView": {("get", "get")},
        "DocsView": {("get", "get")},
        "MetricsView": {("get", "get")},
    }
    assert len(ENDPOINTS) == sum(len(actions) for actions in routes.values())


def test_authentication_is_set_on_every_view_not_read_from_settings():
    """Token then session on every view, /metrics included, whatever the host's REST_FRAMEWORK says."""
    views = routed_views()
    assert MetricsView in views and len(views) == 11
    for cls in views:
        assert cls.authentication_classes == [TokenAuthentication, SessionAuthentication], cls


def test_a_bad_token_is_401(world):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    for url in ("/api/schedules", "/metrics", "/api/docs"):
        response = client.get(url)
        assert response.status_code == 401, url
        assert response["WWW-Authenticate"] == "Token"


def test_an_inactive_users_token_is_401(world, make_api_user, token_client):
    user = make_api_user("gone", superuser=True)
    client = token_client(user)
    user.is_active = False
    user.save()
    assert client.get("/api/schedules").status_code == 401


def test_head_and_options_need_what_reading_needs(world, make_api_user, token_client):
    reader = token_client(make_api_user("reader", perms=["view_schedule"]))
    adder = token_client(make_api_user("adder", perms=["add_schedule"]))
    for url in ("/api/schedules", "/api/schedules/s1"):
        assert reader.head(url).status_code == 200, url
        assert reader.options(url).status_code == 200, url
        assert adder.head(url).status_code == 403, url
        assert adder.options(url).status_code == 403, url
    assert reader.head("/api/stats").status_code == 403


def test_a_method_not_offered_is_405_for_any_authenticated_user(world, make_api_user, token_client):
    for user in (make_api_user("nobody", staff=True), make_api_user("root", superuser=True)):
        client = token_client(user)
        assert client.put("/api/schedules/s1", {"max_attempts": 9}).status_code == 405
        assert client.delete("/api/runs").status_code == 405
    assert token_client().put("/api/schedules/s1", {"max_attempts": 9}).status_code == 401
    assert Schedule.objects.get(name="s1").max_attempts == 3


def test_permissions_come_through_groups_too(world, make_api_user, token_client):
    from django.contrib.auth.models import Group, Permission

    operators = Group.objects.create(name="operators")
    operators.permissions.add(Permission.objects.get(codename="change_schedule"))
    user = make_api_user("member")
    user.groups.add(operators)
    client = token_client(user)
    assert client.post("/api/schedules/s1/pause").status_code == 200
    assert client.get("/api/schedules/s1").json()["paused"] is True  # change implies view
    assert client.get("/api/runs").status_code == 403


def test_session_authentication(world, operator):
    client = APIClient()
    assert client.login(username="operator", password="pw-operator")
    assert client.get("/api/schedules").status_code == 200
    assert client.post("/api/schedules/s1/pause").status_code == 200


def test_session_writes_need_the_csrf_token(world, operator):
    client = APIClient(enforce_csrf_checks=True)
    client.login(username="operator", password="pw-operator")
    assert client.get("/api/schedules").status_code == 200
    response = client.post("/api/schedules/s1/pause")
    assert response.status_code == 403
    assert "CSRF" in response.json()["detail"]
    assert not Schedule.objects.get(name="s1").paused


def test_docs_redirect_keeps_the_query_and_comes_back_after_login(world, operator):
    client = APIClient()
    response = client.get("/api/docs/?lang=en")
    assert response.status_code == 302
    assert response["Location"] == "/admin/login/?next=/api/docs/%3Flang%3Den"
    login = client.post(
        "/admin/login/?next=/api/docs/", {"username": "operator", "password": "pw-operator", "next": "/api/docs/"}
    )
    assert (login.status_code, login["Location"]) == (302, "/api/docs/")
    assert client.get("/api/docs/").status_code == 200
