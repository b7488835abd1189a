"""Representations (output) and input shapes of the REST API.

Input serializers check shapes and JSON types only; the domain rules (a
registered task, a cron that parses, a known time zone, run_at in the future,
one kind of recurrence, ...) stay in ``services.validation`` and come back as
typed errors, which ``api.errors`` turns into field messages.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ..conf import RANGES
from ..errors import ValidationError
from ..models import (
    MAX_PRIORITY,
    MIN_PRIORITY,
    CatchUp,
    Liveness,
    Overlap,
    QueuePause,
    Run,
    RunEvent,
    RunState,
    Schedule,
    ScheduleKind,
    Worker,
    schedule_name_of,
)
from ..services import capabilities as capability_service
from ..services import enqueue as enqueue_service
from ..services import explain as explain_service
from ..services import queries
from ..services import queues as queue_service
from ..services import schedules as schedule_service
from ..services.validation import MAX_ATTEMPTS_LIMIT, MAX_INTERVAL_SECONDS, NAME_MAX, QUEUE_RE
from ..text import UndecodableJSON
from .fields import (
    StrictBooleanField,
    StrictCharField,
    StrictDateTimeField,
    StrictFloatField,
    StrictIntegerField,
)

SCHEDULE_FIELDS = [
    "name",
    "task_name",
    "args",
    "kwargs",
    "kind",
    "interval_seconds",
    "cron",
    "timezone",
    "run_at",
    "start_at",
    "next_run_at",
    "paused",
    "max_attempts",
    "retry_base_seconds",
    "retry_max_seconds",
    "retry_jitter",
    "catch_up",
    "overlap",
    "queue",
    "version",
    "declared",
    "created_at",
    "updated_at",
]
RUN_FIELDS = [
    "id",
    "schedule",
    "task_name",
    "args",
    "kwargs",
    "state",
    "scheduled_for",
    "available_at",
    "attempts",
    "max_attempts",
    "lease_owner",
    "lease_expires_at",
    "started_at",
    "finished_at",
    "last_error",
    "result",
    "queue",
    "priority",
    "origin",
    "schedule_version",
    "idempotency_key",
    "unique_key",
    "retry_policy",
    "cancel_requested",
    "fencing_token",
    "created_at",
    "updated_at",
]


class _StoredJSONList(serializers.ListField):
    """Renders a stored value too deep to decode (``UndecodableJSON``) as the object it is."""

    def to_representation(self, data: Any) -> Any:
        return dict(data) if isinstance(data, UndecodableJSON) else super().to_representation(data)


def json_list(**options: Any) -> serializers.ListField:
    """A JSON array of anything (``args``)."""
    return _StoredJSONList(child=serializers.JSONField(allow_null=True), **options)


def json_object(**options: Any) -> serializers.DictField:
    """A JSON object with values of any type (``kwargs``)."""
    return serializers.DictField(child=serializers.JSONField(allow_null=True), **options)


def _datetime(value: datetime | None) -> str | None:
    return None if value is None else serializers.DateTimeField().to_representation(value)


# --------------------------------------------------------------------------
# Output


class ScheduleSerializer(serializers.ModelSerializer):
    args = json_list(read_only=True)
    kwargs = json_object(read_only=True)
    version = serializers.IntegerField(
        read_only=True,
        help_text="+1 on every change (GET .../history lists them); PATCH may name it as `expected_version`.",
    )
    declared = serializers.SerializerMethodField(
        help_text="Declared in code (DISTSCHED['SCHEDULES'] or `schedule apply --file`): the next apply sets every "
        "field but `paused` back to the declaration."
    )

    class Meta:
        model = Schedule
        fields = SCHEDULE_FIELDS
        read_only_fields = SCHEDULE_FIELDS

    def get_declared(self, schedule: Schedule) -> bool:
        return schedule.declared is not None


class LastRunSerializer(serializers.ModelSerializer):
    class Meta:
        model = Run
        fields = ["id", "state", "scheduled_for", "finished_at"]
        read_only_fields = fields


class ScheduleDetailSerializer(ScheduleSerializer):
    upcoming = serializers.SerializerMethodField(help_text="The next 5 fire times, starting at next_run_at.")
    last_run = serializers.SerializerMethodField(help_text="The schedule's most recently created run.")

    class Meta(ScheduleSerializer.Meta):
        fields = [*SCHEDULE_FIELDS, "upcoming", "last_run"]
        read_only_fields = fields

    @extend_schema_field(serializers.ListField(child=serializers.DateTimeField()))
    def get_upcoming(self, schedule: Schedule) -> list[str | None]:
        # upcoming_fire_times raises OverflowError when a slot would fall after year 9999 (a schedule
        # made in Python near that year); show the slots that do exist rather than fail the request.
        # A stored recurrence that no longer validates (a cron extension the strict dialect
        # refuses, a time zone gone from tzdata) has no upcoming times: show none, not a 500.
        for count in range(5, 0, -1):
            try:
                return [_datetime(t) for t in schedule_service.upcoming_fire_times(schedule, count)]
            except OverflowError:
                continue
            except ValidationError:
                return []
        return []

    @extend_schema_field(LastRunSerializer(allow_null=True))
    def get_last_run(self, schedule: Schedule) -> dict[str, Any] | None:
        run = queries.last_run(schedule)
        return LastRunSerializer(run).data if run is not None else None


class RetryPolicySerializer(serializers.Serializer):
    """An enqueued run's own retry policy, named as ``POST /api/runs`` takes it."""

    max_attempts = serializers.IntegerField()
    retry_base_seconds = serializers.FloatField()
    retry_max_seconds = serializers.FloatField()
    retry_jitter = serializers.FloatField()


class RunSerializer(serializers.ModelSerializer):
    schedule = serializers.SerializerMethodField(
        help_text="The name of the schedule this run belongs to (kept when the schedule is deleted); null for an "
        "enqueued run (origin `enqueued`)."
    )
    schedule_version = serializers.IntegerField(
        read_only=True, allow_null=True, help_text="The version of its schedule that made it; null when enqueued."
    )
    args = json_list(read_only=True)
    kwargs = json_object(read_only=True)
    result = serializers.JSONField(read_only=True, allow_null=True, help_text="The task's return value.")
    fencing_token = serializers.CharField(read_only=True, help_text='"<run id>:<attempt>"; grows with every claim.')
    priority = serializers.IntegerField(
        read_only=True, help_text=f"{MIN_PRIORITY}..{MAX_PRIORITY}; workers claim higher priorities first."
    )
    unique_key = serializers.CharField(
        read_only=True, help_text="While a run with this key is not finished, enqueueing the key again returns it."
    )
    retry_policy = serializers.SerializerMethodField(
        help_text="An enqueued run's own retry policy; null for a run that follows its schedule's."
    )

    class Meta:
        model = Run
        fields = RUN_FIELDS
        read_only_fields = RUN_FIELDS

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_schedule(self, run: Run) -> str | None:
        # Lists annotate the name (services.queries.runs); single runs come with their schedule.
        return schedule_name_of(run)

    @extend_schema_field(RetryPolicySerializer(allow_null=True))
    def get_retry_policy(self, run: Run) -> dict[str, Any] | None:
        policy = enqueue_service.own_policy(run)
        return None if policy is None else enqueue_service.policy_fields(policy)


class QueuePauseSerializer(serializers.ModelSerializer):
    """A queue's pause: when, by whom (``user:<username>``, ``cli:<os user>``, or what code passed), why."""

    class Meta:
        model = QueuePause
        fields = ["paused_at", "paused_by", "reason"]
        read_only_fields = fields


class RunDetailSerializer(RunSerializer):
    """``GET /api/runs/{id}``: the run, and its queue's pause when that queue is paused (one more query);
    ``context["now"]`` is the request's single reading of the clock."""

    queue_pause = serializers.SerializerMethodField(
        help_text="While the run's queue is paused (its waiting runs are not claimed): who paused it, when "
        "and why; null otherwise."
    )
    waiting_for_capabilities = serializers.SerializerMethodField(
        help_text="While the run waits: the capabilities its task requires (TASK_REQUIRES) when no live worker "
        "serving its queue has all of them, so nothing can claim it yet; empty otherwise."
    )
    held_by = serializers.CharField(
        read_only=True,
        help_text='While the run is blocked: what it waits for, "run:<id>" (the run it replaces, overlap=replace) '
        'or "limit:<name>:<partition>"; empty otherwise.',
    )

    class Meta(RunSerializer.Meta):
        fields = [*RUN_FIELDS, "held_by", "queue_pause", "waiting_for_capabilities"]
        read_only_fields = fields

    @extend_schema_field(QueuePauseSerializer(allow_null=True))
    def get_queue_pause(self, run: Run) -> dict[str, Any] | None:
        pause = queue_service.pause_of(run.queue)
        return None if pause is None else QueuePauseSerializer(pause).data

    def get_waiting_for_capabilities(self, run: Run) -> list[str]:
        return capability_service.waiting_for_capabilities(run, now=self.context["now"])


class WaitingReasonSerializer(serializers.Serializer):
    """One reason a run is not running (``services.explain``): a kind, a sentence, and the kind's fields."""

    kind = serializers.CharField(
        help_text="running (leased or running), cancel_requested, queue_paused, capabilities (missing on every "
        "live worker of its queue), concurrency / total (a limit's partition / whole limit is full), paused_limit, "
        "replaces (overlap=replace: the run it waits for), upstream (a workflow node waiting for upstream nodes), "
        "blocked (anything else), rate (a limit's rate moved "
        "its start), not_due (a later slot or a retry's backoff), no_worker (claimable, but no live worker "
        "serves its queue), unknown_task (no live worker serving its queue has its task registered).",
    )
    message = serializers.CharField(help_text="The reason in words, as the CLI and the admin show it.")
    limit = serializers.CharField(required=False, help_text="concurrency, total, paused_limit, rate: the limit.")
    partition = serializers.CharField(
        required=False, allow_blank=True, help_text='The run\'s partition of the limit ("" when it has none).'
    )
    in_use = serializers.IntegerField(
        required=False, help_text="concurrency / total: runs holding a slot (of the partition / the limit)."
    )
    capacity = serializers.IntegerField(
        required=False, allow_null=True, help_text="concurrency / total: the effective cap (overrides included)."
    )
    holders = serializers.ListField(
        child=serializers.IntegerField(),
        required=False,
        help_text="concurrency / total: ids of runs holding those slots, oldest first "
        f"(at most {explain_service.MAX_HOLDERS}).",
    )
    since = serializers.DateTimeField(
        required=False,
        allow_null=True,
        help_text="When the wait began (ISO 8601, UTC): the run's latest blocked event, or the queue's pause.",
    )
    rate = serializers.CharField(required=False, help_text='rate: the partition\'s rate ("2/s").')
    next_start = serializers.DateTimeField(
        required=False, help_text="rate: when the rate next admits it (ISO 8601, UTC)."
    )
    queue = serializers.CharField(
        required=False, help_text="queue_paused, capabilities, no_worker, unknown_task: the run's queue."
    )
    task = serializers.CharField(required=False, help_text="unknown_task: the task no live worker has registered.")
    by = serializers.CharField(required=False, allow_blank=True, help_text="queue_paused, paused_limit: who paused it.")
    reason = serializers.CharField(
        required=False, allow_blank=True, help_text="queue_paused, paused_limit: why, as they said."
    )
    until = serializers.DateTimeField(
        required=False, allow_null=True, help_text="paused_limit: when the override ends (null: until reset)."
    )
    capabilities = serializers.ListField(
        child=serializers.CharField(), required=False, help_text="capabilities: the ones no live worker has."
    )
    replaces = serializers.IntegerField(required=False, help_text="replaces: the run it waits for.")
    replaces_state = serializers.CharField(
        required=False, allow_null=True, help_text="replaces: that run's state (null: it no longer exists)."
    )
    held_by = serializers.CharField(required=False, allow_blank=True, help_text="blocked: the run's held_by.")
    workflow = serializers.IntegerField(required=False, help_text="upstream: the node's workflow.")
    upstream = serializers.ListField(
        child=serializers.DictField(),
        required=False,
        help_text="upstream: the upstream nodes that have not ended, `[{node, run, state}]` "
        f"(at most {explain_service.MAX_HOLDERS}).",
    )
    at = serializers.DateTimeField(required=False, help_text="not_due: when it comes due (ISO 8601, UTC).")
    retry = serializers.BooleanField(required=False, help_text="not_due: true when it is a retry's backoff.")
    owner = serializers.CharField(required=False, allow_blank=True, help_text="running: the worker holding it.")
    lease_expires_at = serializers.DateTimeField(required=False, allow_null=True, help_text="running: its lease's end.")
    lease_expired = serializers.BooleanField(
        required=False, help_text="running: the lease has expired (the next claim recovers the run)."
    )


class RunExplainSerializer(serializers.Serializer):
    """``GET /api/runs/{id}/explain``: why the run is not running (``services.explain``)."""

    run = serializers.IntegerField(help_text="The run's id.")
    state = serializers.ChoiceField(choices=RunState.choices)
    claimable = serializers.BooleanField(
        help_text="A claim would take it now: pending or retrying, due, its queue not paused, no capability missing."
    )
    waiting_for = WaitingReasonSerializer(
        many=True, help_text="Why it is not running; empty for a finished run or a claimable one a worker will take."
    )
    next_possible_start = serializers.DateTimeField(
        allow_null=True,
        help_text="The earliest moment it could start when that is knowable (its available_at: a later slot, a "
        "backoff, a rate's next start; now when claimable); null when it waits for something to end.",
    )


class EnqueuedRunSerializer(RunSerializer):
    """``POST /api/runs``' answer: the run, and whether this request created it.

    ``context["created"]``: False when an unfinished run already held the unique key.
    """

    created = serializers.SerializerMethodField(
        help_text="true (201): this request enqueued the run; false (200): an unfinished run already held "
        "`unique_key`, and this is that run (nothing was written)."
    )

    class Meta(RunSerializer.Meta):
        fields = [*RUN_FIELDS, "created"]
        read_only_fields = fields

    @extend_schema_field(serializers.BooleanField())
    def get_created(self, run: Run) -> bool:
        return bool(self.context["created"])


def key_held(task_name: str, unique_key: str) -> dict[str, Any]:
    """``POST /api/runs``' answer when an unfinished run of the task already holds the unique key,
    to a caller who may not read runs (neither ``view_run`` nor ``change_run``, e.g. an account
    holding ``add_run`` alone): what the caller sent, and ``created`` false. The run holding the key
    is not theirs to see, so a guessed key discloses none of it (its id, arguments, state, result)."""
    return {"created": False, "task_name": task_name, "unique_key": unique_key}


# The 200 answer of POST /api/runs: the run holding the key (EnqueuedRunSerializer), or key_held()'s
# body; closed (no additional properties), so that exactly one of the two describes any answer.
KEY_HELD_SCHEMA = {
    "oneOf": [
        {"$ref": "#/components/schemas/EnqueuedRun"},
        {
            "type": "object",
            "properties": {
                "created": {"type": "boolean", "enum": [False]},
                "task_name": {"type": "string", "description": "As sent."},
                "unique_key": {"type": "string", "description": "As sent."},
            },
            "required": ["created", "task_name", "unique_key"],
            "additionalProperties": False,
        },
    ]
}


class RunEventSerializer(serializers.ModelSerializer):
    run = serializers.IntegerField(source="run_id", read_only=True)

    class Meta:
        model = RunEvent
        fields = ["id", "run", "event_type", "message", "worker_id", "attempt", "created_at"]
        read_only_fields = fields


class WorkerSerializer(serializers.ModelSerializer):
    """``context["now"]`` is the request's single reading of the clock."""

    queues = serializers.ListField(child=serializers.CharField(), read_only=True)
    capabilities = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        help_text="What it offers (runworker --capability): it claims runs of a task in TASK_REQUIRES only with all "
        "of that task's capabilities.",
    )
    current_run = serializers.IntegerField(
        source="current_run_id", read_only=True, allow_null=True, help_text="Id of the run it is executing."
    )
    heartbeat_age_seconds = serializers.SerializerMethodField()
    stale = serializers.SerializerMethodField(
        help_text="Not stopped, but no heartbeat for longer than STALE_AFTER_SECONDS."
    )
    leader = serializers.SerializerMethodField(
        help_text="True for the worker (runworker --with-tick) that leads now: it ticks and runs the periodic "
        "chores. A `tick --loop` leader has no worker row: see `distsched leader`."
    )

    class Meta:
        model = Worker
        fields = [
            "worker_id",
            "hostname",
            "pid",
            "queues",
            "capabilities",
            "status",
            "stale",
            "started_at",
            "heartbeat_at",
            "heartbeat_age_seconds",
            "current_run",
            "clock_skew_seconds",
            "runs_executed",
            "leader",
        ]
        read_only_fields = fields

    def get_leader(self, worker: Worker) -> bool:
        return worker.worker_id == self.context.get("leader")

    def get_heartbeat_age_seconds(self, worker: Worker) -> float:
        return (self.context["now"] - worker.heartbeat_at).total_seconds()

    def get_stale(self, worker: Worker) -> bool:
        return worker.liveness(self.context["now"]) == Liveness.STALE


class RecentFailureSerializer(serializers.Serializer):
    run_id = serializers.IntegerField()
    task_name = serializers.CharField()
    attempt = serializers.IntegerField()
    message = serializers.CharField(allow_blank=True)
    at = serializers.DateTimeField()


class StatsSerializer(serializers.Serializer):
    """The shape of ``services.stats.Stats.as_dict()``."""

    runs_by_state = serializers.DictField(child=serializers.IntegerField())
    schedules_total = serializers.IntegerField()
    schedules_paused = serializers.IntegerField()
    schedules_overdue = serializers.IntegerField()
    workers_alive = serializers.IntegerField()
    workers_stale = serializers.IntegerField()
    workers_stopped = serializers.IntegerField()
    mean_duration_seconds = serializers.FloatField(allow_null=True)
    retries_last_24h = serializers.IntegerField()
    failures_last_24h = serializers.IntegerField()
    recent_failures = RecentFailureSerializer(many=True)


# --------------------------------------------------------------------------
# Input


class ScheduleChangeSerializer(serializers.Serializer):
    """The fields a PATCH may change; each optional (absent = unchanged)."""

    task_name = StrictCharField(max_length=200, required=False, help_text="A registered task name.")
    args = json_list(required=False, help_text="Positional arguments (a JSON array).")
    kwargs = json_object(required=False, help_text="Keyword arguments (a JSON object).")
    kind = serializers.ChoiceField(
        choices=ScheduleKind.choices,
        required=False,
        help_text="Inferred from whichever of interval_seconds, cron or run_at is given.",
    )
    interval_seconds = StrictIntegerField(
        min_value=1,
        max_value=MAX_INTERVAL_SECONDS,
        required=False,
        allow_null=True,
        help_text="Seconds between runs (kind=interval).",
    )
    cron = StrictCharField(
        max_length=200,
        required=False,
        allow_blank=True,
        help_text="Five-field cron expression, evaluated in `timezone` (kind=cron).",
    )
    timezone = StrictCharField(max_length=64, required=False, help_text="IANA time zone of the cron expression.")
    run_at = StrictDateTimeField(
        required=False, allow_null=True, help_text="When a once schedule runs; must be in the future."
    )
    start_at = StrictDateTimeField(
        required=False, allow_null=True, help_text="First slot of an interval or cron schedule."
    )
    paused = StrictBooleanField(required=False)
    max_attempts = StrictIntegerField(min_value=1, max_value=MAX_ATTEMPTS_LIMIT, required=False)
    retry_base_seconds = StrictFloatField(min_value=0, max_value=86400 * 30, required=False)
    retry_max_seconds = StrictFloatField(min_value=0, max_value=86400 * 365, required=False)
    retry_jitter = StrictFloatField(
        min_value=0, max_value=1, required=False, help_text="Extra random delay, as a fraction of the backoff."
    )
    catch_up = serializers.ChoiceField(choices=CatchUp.choices, required=False)
    overlap = serializers.ChoiceField(choices=Overlap.choices, required=False)
    queue = StrictCharField(max_length=100, required=False)
    expected_version = StrictIntegerField(
        min_value=1,
        required=False,
        help_text="The version you read: if someone changed the schedule since, nothing is written (409).",
    )
    reason = StrictCharField(
        max_length=1000,
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        help_text="Why, for whoever reads the history later.",
    )


@extend_schema_field({"type": "string", "pattern": QUEUE_RE.pattern})
class QueueField(StrictCharField):
    """Checked by ``services.validation.validate_queue``; the pattern is for the schema's readers."""


class RunEnqueueSerializer(serializers.Serializer):
    """``POST /api/runs``: one run of a registered task, without a schedule (origin ``enqueued``).

    Whatever is left out comes from the task's declaration: a framework task's
    ``queue_name``, ``priority`` and its backend's ``OPTIONS``; otherwise queue
    ``default``, priority 0 and ``DISTSCHED``'s retry defaults. Each retry option
    given overrides that one field.
    """

    task_name = StrictCharField(
        max_length=200, help_text="A registered task name (a framework task's is its module path)."
    )
    args = json_list(required=False, help_text="Positional arguments (a JSON array).")
    kwargs = json_object(required=False, help_text="Keyword arguments (a JSON object).")
    run_after = StrictDateTimeField(
        required=False, allow_null=True, help_text="Not before this time (with an offset); left out: now."
    )
    priority = StrictIntegerField(
        min_value=MIN_PRIORITY,
        max_value=MAX_PRIORITY,
        required=False,
        help_text="Workers claim higher priorities first (default: the task's declared priority, else 0).",
    )
    queue = QueueField(
        max_length=100,
        required=False,
        help_text="Queue the run goes to (default: the task's declared queue, else `default`).",
    )
    unique_key = StrictCharField(
        max_length=enqueue_service.UNIQUE_KEY_MAX,
        required=False,
        allow_blank=True,
        trim_whitespace=False,  # a key is taken as given, as everywhere else; a blank one is refused
        help_text="While an unfinished run of this task holds this key, nothing is written (200, created false).",
    )
    max_attempts = StrictIntegerField(min_value=1, max_value=MAX_ATTEMPTS_LIMIT, required=False)
    retry_base_seconds = StrictFloatField(min_value=0, max_value=RANGES["RETRY_BASE_SECONDS"][2], required=False)
    retry_max_seconds = StrictFloatField(min_value=0, max_value=RANGES["RETRY_MAX_SECONDS"][2], required=False)
    retry_jitter = StrictFloatField(
        min_value=0, max_value=1, required=False, help_text="Extra random delay, as a fraction of the backoff."
    )


@extend_schema_field({"type": "string", "pattern": "^[A-Za-z0-9_-]+$", "minLength": 1, "maxLength": NAME_MAX})
class ScheduleNameField(StrictCharField):
    """Checked by ``services.validation.validate_name``; the pattern is for the schema's readers."""


class ScheduleCreateSerializer(ScheduleChangeSerializer):
    """A new schedule: `name` and `task_name`, plus exactly one of interval_seconds, cron or run_at."""

    expected_version = None  # type: ignore[assignment]  # a new schedule has no version to expect

    name = ScheduleNameField(
        max_length=NAME_MAX, help_text="Unique slug: letters, digits, '-' and '_'. Cannot be changed later."
    )
    task_name = StrictCharField(max_length=200, help_text="A registered task name.")
