"""REST API: ``POST /api/runs`` enqueues a run of a registered task; enqueued runs in lists and details."""

from __future__ import annotations

from datetime import timedelta

import pytest

from distsched_app import framework
from distsched_app.models import EventType, Origin, Run, RunEvent, RunState
from tests.conftest import T0
from tests.factories import succeed

pytestmark = pytest.mark.django_db


def iso(dt) -> str:
    return dt.isoformat().replace("+00:00", "Z")


def nothing_written() -> bool:
    return not Run.objects.exists() and not RunEvent.objects.exists()


@pytest.fixture
def worker(scheduler):
    return scheduler.worker(worker_id="w1", heartbeat_seconds=3600)


def test_post_writes_one_run_and_one_created_event(api):
    body = {
        "task_name": "tests.echo",
        "args": [1, "two"],
        "kwargs": {"x": {"y": None}},
        "run_after": "2026-03-02T11:30:00+01:00",  # 10:30 UTC
        "priority": 7,
        "queue": "emails",
        "unique_key": "report-42",
    }
    response = api.post("/api/runs", body)
    assert response.status_code == 201, response.json()
    got = response.json()
    run = Run.objects.get()
    later = T0 + timedelta(minutes=90)
    assert got["created"] is True and got["id"] == run.pk
    assert (got["schedule"], got["origin"], got["state"]) == (None, "enqueued", "pending")
    assert (got["priority"], got["queue"], got["unique_key"]) == (7, "emails", "report-42")
    assert got["scheduled_for"] == got["available_at"] == iso(later)
    assert (got["args"], got["kwargs"]) == ([1, "two"], {"x": {"y": None}})
    assert got["idempotency_key"] == f"enqueued:{run.pk}" and got["fencing_token"] == f"{run.pk}:0"
    # The row says the same as the answer.
    assert (run.schedule_id, run.origin, run.task_name, run.priority, run.queue, run.unique_key) == (
        None,
        Origin.ENQUEUED,
        "tests.echo",
        7,
        "emails",
        "report-42",
    )
    assert run.scheduled_for == run.available_at == later and run.created_at == T0
    [event] = RunEvent.objects.all()
    assert (event.run_id, event.event_type, event.message) == (
        run.pk,
        EventType.CREATED,
        "enqueued by operator via the API",
    )


def test_the_default_retry_policy_is_the_distsched_settings(api, settings):
    settings.DISTSCHED = {"MAX_ATTEMPTS": 4, "RETRY_BASE_SECONDS": 2, "RETRY_MAX_SECONDS": 60}
    got = api.post("/api/runs", {"task_name": "tests.noop"}).json()
    assert got["max_attempts"] == 4 and got["queue"] == "default" and got["priority"] == 0
    assert got["retry_policy"] == {
        "max_attempts": 4,
        "retry_base_seconds": 2.0,
        "retry_max_seconds": 60.0,
        "retry_jitter": 0.0,
    }
    assert got["scheduled_for"] == iso(T0) and got["unique_key"] == ""
    assert Run.objects.get().retry_policy == {"attempts": 4, "base": 2.0, "cap": 60.0, "jitter": 0.0}


def test_an_own_retry_policy_is_kept_and_followed(api, api_clock, worker):
    body = {"task_name": "tests.fail", "max_attempts": 2, "retry_base_seconds": 30, "retry_max_seconds": 600}
    got = api.post("/api/runs", body).json()
    assert got["retry_policy"] == {
        "max_attempts": 2,
        "retry_base_seconds": 30.0,
        "retry_max_seconds": 600.0,
        "retry_jitter": 0.0,
    }
    assert worker.run_once().state == RunState.RETRYING
    assert Run.objects.get().available_at == T0 + timedelta(seconds=30)  # its own base, not the settings' 10 s
    api_clock.advance(seconds=30)
    assert worker.run_once().state == RunState.DEAD  # its own budget: two attempts


def test_a_taken_unique_key_returns_the_active_run_and_writes_nothing(api, api_clock):
    first = api.post("/api/runs", {"task_name": "tests.noop", "unique_key": "nightly"})
    assert first.status_code == 201
    again = api.post("/api/runs", {"task_name": "tests.noop", "args": [1], "unique_key": "nightly", "priority": 9})
    assert again.status_code == 200
    got = again.json()
    assert got["created"] is False and got["id"] == first.json()["id"]
    assert (got["task_name"], got["priority"], got["args"]) == ("tests.noop", 0, [])  # the existing run, unchanged
    assert Run.objects.count() == 1 and RunEvent.objects.count() == 1
    # Once that run is finished, the key is free again.
    run = Run.objects.get()
    from distsched_app.services import claiming

    claiming.claim_next_run(worker_id="w1", queues=None, lease_seconds=30, now=api_clock.now())
    succeed(run.pk, worker_id="w1", attempt=1, now=api_clock.now())
    third = api.post("/api/runs", {"task_name": "tests.noop", "unique_key": "nightly"})
    assert third.status_code == 201 and third.json()["created"] is True and third.json()["id"] != run.pk
    assert Run.objects.count() == 2


def test_a_unique_key_another_task_holds_enqueues_this_one(api):
    first = api.post("/api/runs", {"task_name": "tests.noop", "unique_key": "nightly"}).json()
    other = api.post("/api/runs", {"task_name": "tests.echo", "args": [1], "unique_key": "nightly"})
    assert other.status_code == 201
    got = other.json()
    assert (got["created"], got["task_name"], got["args"], got["unique_key"]) == (True, "tests.echo", [1], "nightly")
    assert got["id"] != first["id"] and Run.objects.count() == 2


def test_a_taken_unique_key_discloses_nothing_to_a_caller_who_may_not_read_runs(api, make_api_user, token_client):
    """A service account holding ``add_run`` alone learns that the key is taken, not whose run
    holds it nor what that run carries (its id, arguments, result or error)."""
    secret = api.post(
        "/api/runs", {"task_name": "tests.echo", "kwargs": {"token": "s3cr3t"}, "unique_key": "report-7"}
    ).json()
    enqueuer = token_client(make_api_user("enqueuer", perms=["add_run"]))
    response = enqueuer.post("/api/runs", {"task_name": "tests.echo", "args": [2], "unique_key": "report-7"})
    assert response.status_code == 200
    assert response.json() == {"created": False, "task_name": "tests.echo", "unique_key": "report-7"}
    assert "s3cr3t" not in response.content.decode() and Run.objects.count() == 1
    # What it sends itself still comes back in full.
    own = enqueuer.post("/api/runs", {"task_name": "tests.echo", "args": [3], "unique_key": "report-8"})
    assert own.status_code == 201 and own.json()["args"] == [3] and own.json()["id"] != secret["id"]
    # A caller who may read runs gets the run that holds the key, as before.
    viewer = token_client(make_api_user("viewer", perms=["add_run", "view_run"]))
    seen = viewer.post("/api/runs", {"task_name": "tests.echo", "unique_key": "report-7"}).json()
    assert (seen["created"], seen["id"], seen["kwargs"]) == (False, secret["id"], {"token": "s3cr3t"})


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "task_name"),
        ({"task_name": "no.such.task"}, "task_name"),
        ({"task_name": 5}, "task_name"),
        ({"task_name": "tests.noop", "args": {"a": 1}}, "args"),
        ({"task_name": "tests.noop", "kwargs": [1]}, "kwargs"),
        ({"task_name": "tests.noop", "kwargs": {"k": "nul\u0000"}}, "kwargs"),
        ({"task_name": "tests.noop", "priority": 101}, "priority"),
        ({"task_name": "tests.noop", "priority": -101}, "priority"),
        ({"task_name": "tests.noop", "priority": "5"}, "priority"),
        ({"task_name": "tests.noop", "priority": 1.5}, "priority"),
        ({"task_name": "tests.noop", "run_after": "2026-03-02T10:00:00"}, "run_after"),  # naive
        ({"task_name": "tests.noop", "run_after": "tomorrow"}, "run_after"),
        ({"task_name": "tests.noop", "run_after": "1900-01-01T00:00:00Z"}, "run_after"),
        ({"task_name": "tests.noop", "run_after": 1767225600}, "run_after"),
        ({"task_name": "tests.noop", "queue": "no spaces"}, "queue"),
        ({"task_name": "tests.noop", "queue": ""}, "queue"),
        ({"task_name": "tests.noop", "queue": "q" * 101}, "queue"),
        ({"task_name": "tests.noop", "unique_key": "k" * 256}, "unique_key"),
        ({"task_name": "tests.noop", "unique_key": "nul\u0000"}, "unique_key"),
        ({"task_name": "tests.noop", "unique_key": "  "}, "unique_key"),  # blank: not a key, and not "none"
        ({"task_name": "tests.noop", "max_attempts": 0}, "max_attempts"),
        ({"task_name": "tests.noop", "retry_base_seconds": -1}, "retry_base_seconds"),
        ({"task_name": "tests.noop", "retry_base_seconds": 7200}, "retry_max_seconds"),  # above the default cap
        ({"task_name": "tests.noop", "retry_jitter": 2}, "retry_jitter"),
    ],
)
def test_a_refused_post_is_400_on_the_field_and_writes_nothing(api, body, field):
    response = api.post("/api/runs", body)
    assert response.status_code == 400, response.json()
    assert field in response.json(), response.json()
    assert all(isinstance(m, str) for m in response.json()[field])
    assert nothing_written()


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ('"unique_key": "k\\udcff"', "unique_key"),  # a lone surrogate, as JSON spells it
        ('"task_name": "t\\ud800"', "task_name"),
        ('"kwargs": {"k\\udcff": 1}', "kwargs"),
        ('"args": ["\\u0000"]', "args"),
        ('"retry_max_seconds": 1' + "0" * 400, "retry_max_seconds"),
        ('"max_attempts": 1' + "0" * 400, "max_attempts"),
        ('"priority": -1' + "0" * 400, "priority"),
    ],
)
def test_hostile_json_is_400_on_the_field_and_writes_nothing(api, fields, field):
    body = '{"task_name": "tests.noop", ' + fields + "}" if "task_name" not in fields else "{" + fields + "}"
    response = api.generic("POST", "/api/runs", body.encode("ascii"), content_type="application/json")
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert nothing_written()


def test_payloads_beyond_the_services_limits_are_field_errors(api, settings):
    deep: dict = {}
    for _ in range(40):  # MAX_PAYLOAD_DEPTH is 32
        deep = {"k": deep}
    response = api.post("/api/runs", {"task_name": "tests.noop", "kwargs": deep})
    assert response.status_code == 400 and "nested deeper" in response.json()["kwargs"][0]
    settings.DISTSCHED = {"MAX_PAYLOAD_BYTES": 100}
    response = api.post("/api/runs", {"task_name": "tests.noop", "args": ["x" * 200]})
    assert response.status_code == 400 and "larger than 100 bytes" in response.json()["args"][0]
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1_000
    response = api.post("/api/runs", {"task_name": "tests.noop", "args": ["x" * 2_000]})
    assert response.status_code == 413
    assert nothing_written()


def test_a_body_that_is_not_an_object_or_not_json_is_refused(api):
    assert api.post("/api/runs", ["tests.noop"]).status_code == 400
    assert api.generic("POST", "/api/runs", "{", content_type="application/json").status_code == 400
    assert api.generic("POST", "/api/runs", "task_name=x", content_type="text/plain").status_code == 415
    assert nothing_written()


def test_an_api_enqueued_run_is_executed_by_a_worker(api, worker):
    run_id = api.post("/api/runs", {"task_name": "tests.echo", "args": [3], "kwargs": {"k": "v"}}).json()["id"]
    assert worker.run_once().run_id == run_id
    got = api.get(f"/api/runs/{run_id}").json()
    assert (got["state"], got["result"], got["schedule"]) == ("succeeded", {"args": [3], "kwargs": {"k": "v"}}, None)
    events = [e["event_type"] for e in api.get(f"/api/runs/{run_id}/events").json()["results"]]
    assert events == ["created", "claimed", "started", "succeeded"]


def test_a_framework_task_by_its_module_path(api, worker):
    run_id = api.post("/api/runs", {"task_name": "tests.testapp.tasks.ft_add", "args": [2, 3]}).json()["id"]
    assert worker.run_once().state == RunState.SUCCEEDED
    assert api.get(f"/api/runs/{run_id}").json()["result"] == 5
    result = framework.default_task_backend.get_result(str(run_id))  # the framework sees the same run
    assert result.status == framework.TaskResultStatus.SUCCESSFUL and result.return_value == 5


def test_a_later_run_after_waits_and_priority_goes_first(api, api_clock, worker):
    later = api.post("/api/runs", {"task_name": "tests.noop", "run_after": iso(T0 + timedelta(minutes=5))}).json()
    low = api.post("/api/runs", {"task_name": "tests.noop", "priority": -5}).json()
    high = api.post("/api/runs", {"task_name": "tests.noop", "priority": 50}).json()
    assert [worker.run_once().run_id for _ in range(2)] == [high["id"], low["id"]]
    assert worker.run_once() is None  # not before run_after
    api_clock.advance(minutes=5)
    assert worker.run_once().run_id == later["id"]


# ------------------------------------------------------------------ lists and details


@pytest.fixture
def mixed(api, scheduler, make_schedule):
    """A ticked run of s1, a manual run of s1, two enqueued runs (priority 5 on q2, and -1)."""
    make_schedule("s1")
    [ticked] = scheduler.tick()
    manual = scheduler.trigger("s1")
    high = api.post("/api/runs", {"task_name": "tests.noop", "priority": 5, "queue": "q2"}).json()["id"]
    low = api.post("/api/runs", {"task_name": "tests.echo", "priority": -1, "unique_key": "u"}).json()["id"]
    return {"ticked": ticked.pk, "manual": manual.pk, "high": high, "low": low}


def ids(api, query: str) -> list[int]:
    response = api.get(f"/api/runs?{query}")
    assert response.status_code == 200, response.json()
    return [r["id"] for r in response.json()["results"]]


def test_enqueued_runs_in_the_list_have_no_schedule(api, mixed):
    results = {r["id"]: r for r in api.get("/api/runs").json()["results"]}
    assert set(results) == set(mixed.values())
    assert results[mixed["high"]]["schedule"] is None and results[mixed["ticked"]]["schedule"] == "s1"
    assert (results[mixed["low"]]["priority"], results[mixed["low"]]["unique_key"]) == (-1, "u")
    assert results[mixed["ticked"]]["retry_policy"] is None  # it follows its schedule's
    assert results[mixed["high"]]["retry_policy"]["max_attempts"] == 3
    detail = api.get(f"/api/runs/{mixed['low']}").json()
    detail_only = {"held_by": "", "queue_pause": None, "waiting_for_capabilities": []}
    assert detail == {**results[mixed["low"]], **detail_only}


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("origin=enqueued", ["low", "high"]),
        ("origin=manual", ["manual"]),
        ("origin=schedule", ["ticked"]),
        ("priority=5", ["high"]),
        ("priority=-1", ["low"]),
        ("priority=0", ["manual", "ticked"]),
        ("priority=0&origin=enqueued", []),
        ("origin=enqueued&queue=q2", ["high"]),
        ("origin=enqueued&task_name=tests.echo", ["low"]),
        ("origin=enqueued&state=pending", ["low", "high"]),
        ("schedule=s1", ["manual", "ticked"]),  # enqueued runs belong to no schedule
        ("schedule=s1&origin=enqueued", []),
    ],
)
def test_filters_origin_and_priority(api, mixed, query, expected):
    assert ids(api, query) == [mixed[k] for k in expected]


@pytest.mark.parametrize(
    "query", ["origin=", "origin=cron", "priority=", "priority=high", "priority=101", "priority=-101", "priority=1.5"]
)
def test_bad_origin_or_priority_filters_are_400(api, query):
    response = api.get(f"/api/runs?{query}")
    assert response.status_code == 400
    assert query.split("=")[0] in response.json()


def test_a_list_with_enqueued_runs_costs_the_same_queries(api, mixed, django_assert_num_queries):
    for i in range(20):
        api.post("/api/runs", {"task_name": "tests.noop", "priority": i % 3})
    with django_assert_num_queries(4):  # token, the user's two permission reads, the page
        page = api.get("/api/runs?page_size=50").json()["results"]
    assert len(page) == 24 and sum(r["schedule"] is None for r in page) == 22


# ----------------------------------------------------------------------- the schema


def test_the_schema_documents_the_post_and_the_nullable_schedule(api, operator):
    schema = api.get("/api/schema?format=json").json()
    run = schema["components"]["schemas"]["Run"]["properties"]
    assert run["schedule"]["nullable"] is True and run["retry_policy"]["nullable"] is True
    assert {"priority", "unique_key", "retry_policy"} <= set(run)
    post = schema["paths"]["/api/runs/"]["post"]
    assert {"200", "201", "400", "401", "403", "413", "415"} <= set(post["responses"])
    body = post["requestBody"]["content"]["application/json"]
    ref = body["schema"]["$ref"].rsplit("/", 1)[1]
    fields = schema["components"]["schemas"][ref]
    assert fields["required"] == ["task_name"]
    assert set(fields["properties"]) == {
        "task_name",
        "args",
        "kwargs",
        "run_after",
        "priority",
        "queue",
        "unique_key",
        "max_attempts",
        "retry_base_seconds",
        "retry_max_seconds",
        "retry_jitter",
    }
    assert (fields["properties"]["priority"]["minimum"], fields["properties"]["priority"]["maximum"]) == (-100, 100)
    assert len(body["examples"]) == 3
    created = schema["components"]["schemas"]["EnqueuedRun"]["properties"]["created"]
    assert created["type"] == "boolean"
    params = {p["name"]: p for p in schema["paths"]["/api/runs/"]["get"]["parameters"]}
    assert params["origin"]["schema"]["enum"] == ["enqueued", "manual", "schedule"]
    assert params["priority"]["schema"] == {"type": "integer", "minimum": -100, "maximum": 100}


def test_a_framework_task_posted_without_queue_lands_on_its_declared_queue(api):
    body = api.post("/api/runs", {"task_name": "tests.testapp.tasks.ft_urgent"}).json()
    assert (body["queue"], body["priority"]) == ("urgent", 5)  # @task(priority=5, queue_name="urgent")
