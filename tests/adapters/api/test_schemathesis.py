"""Property-based test of the whole API against its own OpenAPI schema (schemathesis).

The schema is loaded from the WSGI application itself (``/api/schema``, with a
superuser's token), and every operation is called in-process with generated
valid and invalid input, bounded and derandomized. Every built-in check runs:
no 5xx, documented status codes, content types and headers, responses matching
their schemas, invalid input rejected, unsupported methods answered with 405.
See ``EXCLUDED`` for the one exception.

One pytest test per operation and generation mode, each drawing cases from
``APIOperation.as_strategy``: schemathesis' own lazy loader
(``schemathesis.pytest.from_fixture``) needs ``Node._nodeid``, which pytest 9.2
no longer has, and the schema cannot be loaded at import time because reading
it needs a staff user in the test database.
"""

from __future__ import annotations

import re

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from hypothesis import HealthCheck, given, settings
from rest_framework.authtoken.models import Token
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from distsched_app import workflows
from distsched_app.services import claiming

pytestmark = pytest.mark.django_db

# Schema-valid bodies of these operations can still break domain rules
# that JSON Schema cannot express: "exactly one of interval_seconds / cron /
# run_at", run_at later than the server's clock, a cron expression that
# parses, a registered task name, an IANA zone, retry_max_seconds >=
# retry_base_seconds, a unique name; for an enqueued run, the task name again,
# run_after from 1970, args/kwargs within MAX_PAYLOAD_BYTES and MAX_PAYLOAD_DEPTH.
# The API answers those with a documented 400 and field messages, which is
# right, so "valid data must be accepted" cannot hold for them. Every other
# check still runs on them, and this check runs on every other operation.
EXCLUDED = {
    ("POST", "/api/schedules/"): [positive_data_acceptance],
    ("PATCH", "/api/schedules/{name}/"): [positive_data_acceptance],
    ("POST", "/api/runs/"): [positive_data_acceptance],
    # A limit's override: at least one number, for_seconds or until (not both), until in the future, a rate's
    # count and period in range.
    ("PATCH", "/api/limits/{name}/"): [positive_data_acceptance],
    # A restored configuration meets the same rules as a PATCH (a once schedule's run_at in the past).
    ("POST", "/api/schedules/{name}/restore/"): [positive_data_acceptance],
    # A bulk action's filter must name a state the action applies to (requeue: dead or cancelled).
    ("POST", "/api/runs/bulk/"): [positive_data_acceptance],
    # A workflow spec: registered tasks, unique node ids, known and acyclic `after`, storable payloads.
    ("POST", "/api/workflows/"): [positive_data_acceptance],
}


@pytest.fixture
def api_headers(make_api_user):
    admin = make_api_user("root", superuser=True)
    return {"Authorization": f"Token {Token.objects.create(user=admin).key}"}


@pytest.fixture
def seeded(api_clock, scheduler, make_schedule, settings):
    """A little of everything; returns path parameters naming rows that exist (a limit is named like the
    schedule, so that the limits' detail endpoints are called on one that exists too)."""
    settings.DISTSCHED = {**settings.DISTSCHED, "LIMITS": {"every-minute": {"queue": "limited", "concurrency": 1}}}
    make_schedule("nightly", cron="0 3 * * *", timezone="Europe/Paris")
    make_schedule("every-minute", task_name="tests.echo", interval_seconds=60, kwargs={"x": 1})
    scheduler.tick()
    scheduler.trigger("every-minute")
    running = claiming.claim_next_run(worker_id="w1", queues=None, lease_seconds=30, now=api_clock.now())
    workflows.enqueue({"name": "flow", "nodes": [{"id": "a", "task": "tests.noop"}]}, clock=api_clock)
    return {"name": "every-minute", "id": running.pk}


@pytest.fixture
def api_schema(wsgi_in_test_transaction, api_headers, seeded):
    return schemathesis.openapi.from_wsgi("/api/schema?format=json", WSGIHandler(), headers=api_headers)


OPERATIONS = [
    ("GET", "/api/schedules/"),
    ("POST", "/api/schedules/"),
    ("GET", "/api/schedules/{name}/"),
    ("PATCH", "/api/schedules/{name}/"),
    ("DELETE", "/api/schedules/{name}/"),
    ("POST", "/api/schedules/{name}/pause/"),
    ("POST", "/api/schedules/{name}/resume/"),
    ("POST", "/api/schedules/{name}/trigger/"),
    ("GET", "/api/schedules/{name}/history/"),
    ("POST", "/api/schedules/{name}/restore/"),
    ("GET", "/api/runs/"),
    ("POST", "/api/runs/"),
    ("GET", "/api/runs/{id}/"),
    ("GET", "/api/runs/{id}/events/"),
    ("GET", "/api/runs/{id}/explain/"),
    ("POST", "/api/runs/{id}/cancel/"),
    ("POST", "/api/runs/{id}/requeue/"),
    ("GET", "/api/runs/bulk/"),
    ("POST", "/api/runs/bulk/"),
    ("GET", "/api/runs/bulk/{id}/"),
    ("POST", "/api/runs/bulk/{id}/cancel/"),
    ("GET", "/api/workers/"),
    ("GET", "/api/stats/"),
    ("GET", "/api/queues/"),
    ("POST", "/api/queues/{name}/pause/"),
    ("POST", "/api/queues/{name}/resume/"),
    ("GET", "/api/limits/"),
    ("GET", "/api/limits/{name}/"),
    ("PATCH", "/api/limits/{name}/"),
    ("POST", "/api/limits/{name}/reset/"),
    ("GET", "/api/workflows/"),
    ("POST", "/api/workflows/"),
    ("GET", "/api/workflows/{id}/"),
    ("POST", "/api/workflows/{id}/cancel/"),
]


def _operations(api_schema) -> dict[tuple[str, str], object]:
    return {(op.method.upper(), op.path): op for op in (r.ok() for r in api_schema.get_all_operations())}


def test_every_operation_is_fuzzed(api_schema):
    assert sorted(_operations(api_schema)) == sorted(OPERATIONS)


# GET /api/stats, /api/queues and /api/limits take no input at all, so there is no invalid request to generate
# for them.
NO_INPUT = {("GET", "/api/stats/"), ("GET", "/api/queues/"), ("GET", "/api/limits/")}
CASES = [
    pytest.param(method, path, mode, id=f"{mode.value} {method} {path}")
    for method, path in OPERATIONS
    for mode in GenerationMode
    if mode is GenerationMode.POSITIVE or (method, path) not in NO_INPUT
]


def strategies(operation, mode: GenerationMode, existing: dict) -> list[tuple[object, int]]:
    """(strategy, examples to draw): generated requests; for valid ones, also requests aimed at rows
    that exist, and the schema's own request examples. Random names and ids are almost always 404s,
    which would leave the 2xx responses of detail endpoints unchecked."""
    found = [(operation.as_strategy(generation_mode=mode), 20)]
    if mode is GenerationMode.POSITIVE:
        fixed = {name: existing[name] for name in re.findall(r"{(\w+)}", operation.path)}
        if fixed:
            found.append((operation.as_strategy(generation_mode=mode, path_parameters=fixed), 10))
        found.extend((example, 3) for example in operation.schema.get_strategies_from_examples(operation))
    return found


@pytest.mark.parametrize(("method", "path", "mode"), CASES)
def test_api_conforms_to_its_schema(api_schema, api_headers, seeded, method, path, mode):
    operation = _operations(api_schema)[(method, path)]
    excluded = EXCLUDED.get((method, path), [])

    for strategy, max_examples in strategies(operation, mode, seeded):

        @given(case=strategy)
        @settings(
            max_examples=max_examples,
            derandomize=True,
            deadline=None,
            database=None,
            # Bodies are filtered hard in negative mode; examples share the test's transaction.
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        )
        def call(case):
            case.call_and_validate(headers=api_headers, excluded_checks=excluded)

        call()
