"""OpenAPI request examples and path parameters of the API's operations (``views`` uses them)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample, OpenApiParameter

from ..services.validation import NAME_MAX

MAX_RUN_ID = 2**63 - 1

CREATE_EXAMPLES = [
    OpenApiExample(
        "Every hour",
        request_only=True,
        value={
            "name": "hourly-heartbeat",
            "task_name": "demo.heartbeat",
            "interval_seconds": 3600,
        },
    ),
    OpenApiExample(
        "Cron in a time zone",
        request_only=True,
        value={
            "name": "nightly-heartbeat",
            "task_name": "demo.heartbeat",
            "cron": "0 3 * * *",
            "timezone": "Europe/Paris",
            "max_attempts": 5,
            "retry_base_seconds": 30,
            "catch_up": "skip",
            "overlap": "skip",
        },
    ),
    OpenApiExample(
        "Once",
        request_only=True,
        value={
            "name": "new-year",
            "task_name": "demo.heartbeat",
            "run_at": "2030-01-01T00:00:00Z",
        },
    ),
]
CHANGE_EXAMPLES = [
    OpenApiExample("New interval", request_only=True, value={"interval_seconds": 600}),
    OpenApiExample("Switch to cron", request_only=True, value={"cron": "*/15 * * * *", "timezone": "UTC"}),
    OpenApiExample("Retry policy", request_only=True, value={"max_attempts": 5, "retry_base_seconds": 30}),
]


NAME_PARAM = OpenApiParameter(
    "name",
    {"type": "string", "pattern": "^[A-Za-z0-9_-]+$", "maxLength": NAME_MAX},
    OpenApiParameter.PATH,
    description="The schedule's name.",
)
ID_PARAM = OpenApiParameter(
    "id", {"type": "integer", "minimum": 1, "maximum": MAX_RUN_ID}, OpenApiParameter.PATH, description="The run's id."
)


ENQUEUE_EXAMPLES = [
    OpenApiExample("Now", request_only=True, value={"task_name": "demo.heartbeat"}),
    OpenApiExample(
        "Later, first in line, at most one at a time",
        request_only=True,
        value={
            "task_name": "demo.daily_summary",
            "kwargs": {"account_id": 42},
            "run_after": "2030-01-01T07:30:00+01:00",
            "priority": 10,
            "queue": "default",
            "unique_key": "daily-summary-42",
        },
    ),
    OpenApiExample(
        "Own retry policy",
        request_only=True,
        value={"task_name": "demo.heartbeat", "max_attempts": 5, "retry_base_seconds": 30, "retry_jitter": 0.1},
    ),
]
