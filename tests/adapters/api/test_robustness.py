"""REST API: hostile or sloppy input gets a 4xx with a reason, never a 500."""

from __future__ import annotations

import json

import pytest
from django.core.exceptions import RequestDataTooBig
from rest_framework import exceptions

from distsched_app import errors
from distsched_app.api.errors import Conflict, PayloadTooLarge, exception_handler, translate
from distsched_app.models import Schedule

pytestmark = pytest.mark.django_db

VALID = {"name": "s1", "task_name": "tests.noop", "interval_seconds": 60}


def post_raw(api, body: bytes | str, content_type: str = "application/json", url: str = "/api/schedules"):
    return api.generic("POST", url, body, content_type=content_type)


@pytest.mark.parametrize(
    "body",
    [
        "{",
        '{"name": "s1",}',
        "{'name': 's1'}",
        '{"name": "s1", "task_name": "tests.noop", "interval_seconds": NaN}',
        '{"name": "s1", "task_name": "tests.noop", "interval_seconds": Infinity}',
        '{"name": "s1", "task_name": "tests.noop", "interval_seconds": 1e999}',
        '{"name": "s1", "task_name": "tests.noop", "interval_seconds": ' + "9" * 5000 + "}",
        '{"kwargs": ' + "[" * 100_000 + "]" * 100_000 + "}",
        b'{"name": "\xff\xfe"}',
    ],
    ids=["truncated", "trailing-comma", "single-quotes", "nan", "infinity", "1e999", "5000-digits", "deep", "latin1"],
)
def test_unparseable_json_is_400_with_the_field_error_shape(api, body):
    response = post_raw(api, body)
    assert response.status_code == 400
    [message] = response.json()["non_field_errors"]
    assert set(response.json()) == {"non_field_errors"}
    assert message.startswith("JSON parse error")
    assert not Schedule.objects.exists()


def test_json_nested_beyond_the_parser_limit_is_400(api):
    kwargs: dict = {}
    for _ in range(70):
        kwargs = {"k": kwargs}
    response = post_raw(api, json.dumps({**VALID, "kwargs": kwargs}))
    assert response.status_code == 400 and "nested deeper" in response.json()["non_field_errors"][0]


def test_payload_deeper_than_the_service_allows_is_a_field_error(api):
    kwargs: dict = {}
    for _ in range(40):
        kwargs = {"k": kwargs}
    response = post_raw(api, json.dumps({**VALID, "kwargs": kwargs}))
    assert response.status_code == 400 and "kwargs" in response.json()


def test_oversized_body_is_413(api, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    response = post_raw(api, json.dumps({**VALID, "kwargs": {"blob": "x" * 20_000}}))
    assert response.status_code == 413
    assert response.json() == {"detail": "request body is larger than 10000 bytes"}
    assert not Schedule.objects.exists()


def test_djangos_request_data_too_big_is_413_too(settings):
    """Raised when something reads the body before the parser does (a host's middleware, say)."""
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1_000
    response = exception_handler(RequestDataTooBig("Request body exceeded settings.DATA_UPLOAD_MAX_MEMORY_SIZE."), {})
    assert response.status_code == 413
    assert response.data == {"detail": "request body is larger than 1000 bytes"}


def test_payload_larger_than_the_service_allows_is_a_field_error(api, settings):
    settings.DISTSCHED = {"MAX_PAYLOAD_BYTES": 100}
    response = post_raw(api, json.dumps({**VALID, "args": ["x" * 200]}))
    assert response.status_code == 400 and "args" in response.json()


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/xml"],
)
def test_bodies_that_are_not_json_are_415(api, content_type):
    response = post_raw(api, "name=s1&task_name=tests.noop&interval_seconds=60", content_type=content_type)
    assert response.status_code == 415
    assert "Unsupported media type" in response.json()["detail"]
    assert not Schedule.objects.exists()


@pytest.mark.parametrize("body", ["null", "[]", '"s1"', "42", "true", ""])
def test_bodies_that_are_not_objects_are_400(api, body):
    response = post_raw(api, body)
    assert response.status_code == 400
    assert all(isinstance(messages, list) for messages in response.json().values()), response.json()


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"cron": None}, "cron"),
        ({"timezone": None}, "timezone"),
        ({"queue": None}, "queue"),
        ({"max_attempts": None}, "max_attempts"),
        ({"retry_jitter": None}, "retry_jitter"),
        ({"catch_up": None}, "catch_up"),
        ({"args": None}, "args"),
        ({"args": [1, {"deep": "\x00"}]}, "args"),
        ({"kwargs": {"\x00": 1}}, "kwargs"),
        ({"task_name": "tests.\x00noop"}, "task_name"),
        ({"task_name": ["tests.noop"]}, "task_name"),
        ({"interval_seconds": True}, "interval_seconds"),
        ({"interval_seconds": [60]}, "interval_seconds"),
        ({"retry_base_seconds": "10"}, "retry_base_seconds"),
        ({"retry_base_seconds": 10**400}, "retry_base_seconds"),
        ({"start_at": 1700000000}, "start_at"),
        ({"start_at": "9999-12-31T23:59:59-12:00"}, "start_at"),
        ({"start_at": "0001-01-01T00:00:00+14:00"}, "start_at"),
    ],
)
def test_nulls_and_wrong_types_in_a_patch_are_field_errors(api, make_schedule, patch, field):
    make_schedule("s1")
    response = api.patch("/api/schedules/s1", patch)
    assert response.status_code == 400, response.content
    assert field in response.json()


def test_nulls_inside_payloads_are_just_json(api):
    response = api.post("/api/schedules", {**VALID, "args": [None], "kwargs": {"a": None}, "start_at": None})
    assert response.status_code == 201, response.json()
    assert (response.json()["args"], response.json()["kwargs"]) == ([None], {"a": None})


def test_unknown_fields_are_ignored(api):
    response = api.post("/api/schedules", {**VALID, "next_run_at": "2030-01-01T00:00:00Z", "bogus": 1})
    assert response.status_code == 201
    assert response.json()["next_run_at"] == "2026-03-02T09:00:00Z"


def test_unicode_and_control_characters_in_names(api):
    assert api.post("/api/schedules", {**VALID, "name": "caf\u00e9"}).status_code == 400
    assert api.post("/api/schedules", {**VALID, "name": "tab\there"}).status_code == 400
    assert api.post("/api/schedules", {**VALID, "name": "nul\x00"}).status_code == 400


@pytest.mark.parametrize("query", ["task_name=%00", "schedule=a%00b", "queue=%00", "state=%00", "page_size=%00"])
def test_nul_in_query_parameters_is_400(api, make_schedule, query):
    make_schedule("s1")
    response = api.get(f"/api/runs?{query}")
    assert response.status_code == 400
    assert query.split("=")[0] in response.json()


def test_nul_in_a_cursor_is_not_a_server_error(api, make_schedule):
    # base64 decoding drops the stray byte: the cursor reads as "from the start".
    make_schedule("s1")
    assert api.get("/api/runs?cursor=%00").status_code == 200
    assert api.get("/api/schedules?cursor=%00").status_code == 200


def test_translate_maps_every_typed_error():
    assert translate(errors.InvalidCron("bad")).detail == {"cron": ["bad"]}
    assert translate(errors.ValidationError("bad")).detail == {"non_field_errors": ["bad"]}
    assert translate(errors.ValidationError("bad", field="queue")).detail == {"queue": ["bad"]}
    assert isinstance(translate(errors.RunNotFound("gone")), exceptions.NotFound)
    assert isinstance(translate(errors.InvalidStateTransition("no")), Conflict)
    assert translate(errors.DuplicateTask("twice")).detail == {"non_field_errors": ["twice"]}
    too_big = translate(RequestDataTooBig("Request body exceeded settings.DATA_UPLOAD_MAX_MEMORY_SIZE."))
    assert isinstance(too_big, PayloadTooLarge) and too_big.status_code == 413
    other = ValueError("not ours")
    assert translate(other) is other
