"""REST API: one error body per status, as the error table of docs/reference/rest.md says.

Every 400 is ``{"field": ["message", ...]}``; every other 4xx is ``{"detail": "..."}``.
"""

from __future__ import annotations

import json

import pytest

from distsched_app.models import Run, RunState

pytestmark = pytest.mark.django_db


def is_field_errors(body: object) -> bool:
    return (
        isinstance(body, dict)
        and bool(body)
        and all(isinstance(messages, list) and all(isinstance(m, str) for m in messages) for messages in body.values())
    )


def is_detail(body: object) -> bool:
    return isinstance(body, dict) and set(body) == {"detail"} and isinstance(body["detail"], str)


@pytest.fixture
def world(api, scheduler, make_schedule):
    make_schedule("s1")
    [run] = scheduler.tick()
    return run


@pytest.mark.parametrize(
    ("method", "url", "body", "content_type", "status"),
    [
        ("post", "/api/schedules", {"name": "x", "task_name": "tests.noop", "interval_seconds": 0}, None, 400),
        ("post", "/api/schedules", {"name": "s1", "task_name": "tests.noop", "interval_seconds": 60}, None, 400),
        ("post", "/api/schedules", '{"name": ', "application/json", 400),
        ("post", "/api/schedules", "[1, 2]", "application/json", 400),
        ("patch", "/api/schedules/s1", {"cron": "not a cron"}, None, 400),
        ("get", "/api/runs?page_size=0", None, None, 400),
        ("get", "/api/runs?state=nope", None, None, 400),
        ("get", "/api/schedules/nope", None, None, 404),
        ("get", "/api/runs/abc", None, None, 404),
        ("get", "/api/runs?cursor=bogus", None, None, 404),
        ("get", "/api/nope", None, None, 404),
        ("get", "/api/", None, None, 404),
        ("post", "/api/runs/{run}/nope", None, None, 404),
        ("get", "/api/schedules/s1/pause/extra", None, None, 404),
        ("put", "/api/schedules/s1", {"max_attempts": 2}, None, 405),
        ("get", "/api/schedules/s1/pause", None, None, 405),
        ("post", "/api/runs/{run}/requeue", None, None, 409),
        ("post", "/api/schedules", "name=x", "application/x-www-form-urlencoded", 415),
    ],
)
def test_error_bodies_have_one_shape_per_status(api, world, method, url, body, content_type, status):
    url = url.format(run=world.pk)
    if content_type is None:
        response = getattr(api, method)(url, body, format="json") if body is not None else getattr(api, method)(url)
    else:
        response = api.generic(method.upper(), url, body, content_type=content_type)
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    data = json.loads(response.content)
    assert is_field_errors(data) if status == 400 else is_detail(data), data
    assert Run.objects.get(pk=world.pk).state == RunState.PENDING


def test_unknown_api_paths_are_json_404s_for_anonymous_callers_too(client):
    for url in ("/api/nope", "/api/schedules/s1/x/y", "/api/"):
        response = client.get(url)
        assert response.status_code == 404, url
        assert response.json() == {"detail": f"no API endpoint at {url}"}


def test_401_and_403_bodies(world, token_client, make_api_user):
    for client, status in ((token_client(), 401), (token_client(make_api_user("nobody")), 403)):
        for method, url in (("get", "/api/schedules"), ("post", "/api/schedules/s1/pause")):
            response = getattr(client, method)(url)
            assert response.status_code == status
            assert is_detail(response.json())
