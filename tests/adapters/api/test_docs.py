"""REST API: the OpenAPI 3 schema and the Swagger UI, served locally (no CDN)."""

from __future__ import annotations

import re

import pytest
from django.contrib.staticfiles import finders
from django.contrib.staticfiles.handlers import StaticFilesHandler
from django.core.handlers.wsgi import WSGIHandler
from drf_spectacular.validation import validate_schema
from werkzeug.test import Client

pytestmark = pytest.mark.django_db

PATHS = {
    "/api/schedules/": {"get", "post"},
    "/api/schedules/{name}/": {"get", "patch", "delete"},
    "/api/schedules/{name}/pause/": {"post"},
    "/api/schedules/{name}/resume/": {"post"},
    "/api/schedules/{name}/trigger/": {"post"},
    "/api/schedules/{name}/history/": {"get"},
    "/api/schedules/{name}/restore/": {"post"},
    "/api/runs/": {"get", "post"},
    "/api/runs/{id}/": {"get"},
    "/api/runs/{id}/events/": {"get"},
    "/api/runs/{id}/explain/": {"get"},
    "/api/runs/{id}/cancel/": {"post"},
    "/api/runs/{id}/requeue/": {"post"},
    "/api/runs/bulk/": {"get", "post"},
    "/api/runs/bulk/{id}/": {"get"},
    "/api/runs/bulk/{id}/cancel/": {"post"},
    "/api/workers/": {"get"},
    "/api/stats/": {"get"},
    "/api/queues/": {"get"},
    "/api/queues/{name}/pause/": {"post"},
    "/api/queues/{name}/resume/": {"post"},
    "/api/limits/": {"get"},
    "/api/limits/{name}/": {"get", "patch"},
    "/api/limits/{name}/reset/": {"post"},
    "/api/workflows/": {"get", "post"},
    "/api/workflows/{id}/": {"get"},
    "/api/workflows/{id}/cancel/": {"post"},
}


@pytest.mark.parametrize("url", ["/api/schema?format=json", "/api/schema/?format=json"])
def test_schema_is_valid_openapi_3_covering_every_endpoint(api, url):
    response = api.get(url)
    assert response.status_code == 200
    schema = response.json()
    validate_schema(schema)
    assert schema["openapi"].startswith("3.")
    assert {path: set(ops) for path, ops in schema["paths"].items()} == PATHS
    assert set(schema["components"]["securitySchemes"]) == {"tokenAuth", "cookieAuth"}
    runs = schema["paths"]["/api/runs/"]["get"]
    assert {p["name"] for p in runs["parameters"]} == {
        "cursor",
        "page_size",
        "state",
        "schedule",
        "task_name",
        "queue",
        "origin",
        "priority",
        "since",
        "until",
    }
    cancel = set(schema["paths"]["/api/runs/{id}/cancel/"]["post"]["responses"])
    assert {"200", "400", "401", "403", "404", "409", "413", "415"} == cancel


def test_schema_defaults_to_yaml(api):
    response = api.get("/api/schema")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/vnd.oai.openapi")
    assert b"openapi: 3." in response.content


def test_schema_and_docs_need_a_distsched_permission(make_api_user, token_client, api_clock):
    anonymous = token_client()
    staff_without_permissions = token_client(make_api_user("staff", staff=True))
    assert anonymous.get("/api/schema").status_code == 401
    assert anonymous.get("/api/docs")["Location"] == "/admin/login/?next=/api/docs"
    for url in ("/api/schema", "/api/docs"):
        assert staff_without_permissions.get(url).status_code == 403


def test_every_operation_documents_its_error_statuses(api):
    paths = api.get("/api/schema?format=json").json()["paths"]
    for path, operations in paths.items():
        for method, operation in operations.items():
            codes = set(operation["responses"])
            assert {"401", "403"} <= codes, (method, path)
            if "requestBody" in operation:
                assert {"400", "413", "415"} <= codes, (method, path)


@pytest.mark.parametrize("url", ["/api/docs", "/api/docs/"])
def test_swagger_ui_uses_local_static_files(api, url):
    response = api.get(url)
    assert response.status_code == 200
    html = response.content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in html
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui.css" in html
    assert "/api/schema" in html
    assert not re.search(r"https?://(cdn\.jsdelivr\.net|unpkg\.com|cdnjs)", html)


def test_swagger_ui_assets_are_served(api, wsgi_in_test_transaction):
    html = api.get("/api/docs").content.decode()
    assets = re.findall(r'"(/static/drf_spectacular_sidecar/[^"]+)"', html)
    assert any(a.endswith("swagger-ui-bundle.js") for a in assets)
    # The WSGI application as runserver (and a static files server) expose it, staticfiles finders included.
    client = Client(StaticFilesHandler(WSGIHandler()))
    for asset in assets:
        path = asset.split("?")[0]
        assert finders.find(path.removeprefix("/static/")), path
        response = client.get(path)
        assert response.status_code == 200, path
        assert response.get_data()
    bundle = client.get("/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js")
    assert "javascript" in bundle.headers["Content-Type"]
