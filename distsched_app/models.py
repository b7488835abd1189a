"""Durable state: schedules, runs, workers and the append-only run history.

Fields, states, constraints, indexes and the QuerySet vocabulary the services
use (``due``, ``waiting``, ``claimable``, ``alive``/``stale``/``stopped``). Transitions live in
``services``. Queue pauses and their history are in ``queue_models`` (re-exported here).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TypeVar, cast

from django.db import models
from django.db.models import F, Q

from .audit_models import AuditAction, AuditEntry, AuditSource, AuditTarget  # noqa: F401 - re-exported
from .bulk_models import UNFINISHED_BULK_STATES, BulkAction, BulkKind, BulkState  # noqa: F401 - re-exported
from .conf import conf
from .db.indexes import NullsOrderedIndex
from .fields import StorableJSONField
from .figure_models import StoredFigure  # noqa: F401 - re-exported
from .leader_models import Leader  # noqa: F401 - re-exported
from .limit_models import Limit, LimitAction, LimitEvent, LimitHold, LimitPartition  # noqa: F401 - re-exported
from .queue_models import QueueAction, QueueEvent, QueuePause, not_paused_sql  # noqa: F401 - re-exported
from .workflow_models import (  # noqa: F401 - re-exported
    UpstreamFailure,
    Workflow,
    WorkflowEdge,
    WorkflowNode,
    WorkflowState,
)


class ScheduleKind(models.TextChoices):
    ONCE = "once", "once"
    INTERVAL = "interval", "interval"
    CRON = "cron", "cron"


class CatchUp(models.TextChoices):
    SKIP = "skip", "skip"
    ONE = "one", "one"
    ALL = "all", "all"


class Overlap(models.TextChoices):
    ALLOW = "allow", "allow"
    SKIP = "skip", "skip"
    # The running run is asked to stop (cooperative cancel); the new slot's run is blocked behind it
    # until it has ended or its lease expired.
    REPLACE = "replace", "replace"


class RunState(models.TextChoices):
    PENDING = "pending", "pending"
    LEASED = "leased", "leased"
    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"
    RETRYING = "retrying", "retrying"
    DEAD = "dead", "dead"
    CANCELLED = "cancelled", "cancelled"
    SKIPPED = "skipped", "skipped"
    # Held back by a concurrency limit (or behind the run it replaces): not claimable, no lease, no
    # attempt used; made pending again by the transaction that frees what it waits for (``held_by``).
    BLOCKED = "blocked", "blocked"


WAITING_STATES = (RunState.PENDING, RunState.RETRYING)
LEASED_STATES = (RunState.LEASED, RunState.RUNNING)
ACTIVE_STATES = (*WAITING_STATES, RunState.BLOCKED, *LEASED_STATES)
TERMINAL_STATES = (RunState.SUCCEEDED, RunState.DEAD, RunState.CANCELLED, RunState.SKIPPED)


class Origin(models.TextChoices):
    SCHEDULE = "schedule", "schedule"
    MANUAL = "manual", "manual"
    ENQUEUED = "enqueued", "enqueued"  # by code: django.tasks' enqueue(), the API, the CLI


MIN_PRIORITY, MAX_PRIORITY = -100, 100


class WorkerStatus(models.TextChoices):
    ACTIVE = "active", "active"
    STOPPING = "stopping", "stopping"
    STOPPED = "stopped", "stopped"


class EventType(models.TextChoices):
    CREATED = "created", "created"
    CLAIMED = "claimed", "claimed"
    STARTED = "started", "started"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    RETRY_SCHEDULED = "retry_scheduled", "retry scheduled"
    LEASE_EXPIRED = "lease_expired", "lease expired"
    MARKED_DEAD = "marked_dead", "marked dead"
    CANCEL_REQUESTED = "cancel_requested", "cancel requested"
    CANCELLED = "cancelled", "cancelled"
    REQUEUED = "requeued", "requeued"
    LEASE_LOST = "lease_lost", "lease lost"
    SKIPPED = "skipped", "skipped"
    RELEASED = "released", "released"
    RECORD_FAILED = "record_failed", "record failed"
    BLOCKED = "blocked", "blocked"  # held back by a concurrency limit: once per wait
    UNBLOCKED = "unblocked", "unblocked"  # a slot freed: claimable again
    THROTTLED = "throttled", "throttled"  # a rate limit moved its available_at: once per wait
    REPLACED = "replaced", "replaced"  # overlap=replace: a newer slot's run asked this one to stop


class ScheduleQuerySet(models.QuerySet):
    def due(self, now: datetime) -> ScheduleQuerySet:
        """Active schedules whose next slot has come."""
        return self.filter(paused=False, next_run_at__isnull=False, next_run_at__lte=now)

    def overdue(self, now: datetime, grace_seconds: float) -> ScheduleQuerySet:
        """Due for longer than ``grace_seconds``: no ticker is running."""
        return self.due(now - timedelta(seconds=grace_seconds))


class Schedule(models.Model):
    name = models.SlugField(max_length=100, unique=True)
    task_name = models.CharField(max_length=200)
    args = StorableJSONField(default=list, blank=True)
    kwargs = StorableJSONField(default=dict, blank=True)
    kind = models.CharField(max_length=10, choices=ScheduleKind.choices)
    interval_seconds = models.PositiveIntegerField(null=True, blank=True)
    cron = models.CharField(max_length=200, blank=True, default="")
    timezone = models.CharField(max_length=64, default="UTC")
    run_at = models.DateTimeField(null=True, blank=True)
    start_at = models.DateTimeField(null=True, blank=True)
    next_run_at = models.DateTimeField(null=True, blank=True)
    paused = models.BooleanField(default=False)
    max_attempts = models.PositiveIntegerField(default=3)
    retry_base_seconds = models.FloatField(default=10)
    retry_max_seconds = models.FloatField(default=3600)
    retry_jitter = models.FloatField(
        default=0, help_text="Extra random delay, as a fraction of the backoff (0 = none)."
    )
    catch_up = models.CharField(max_length=5, choices=CatchUp.choices, default=CatchUp.ONE)
    overlap = models.CharField(max_length=10, choices=Overlap.choices, default=Overlap.ALLOW)
    queue = models.CharField(max_length=100, default="default")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    # +1 on every recorded change of the configuration (``services.audit``; a trigger makes none);
    # runs carry the version that made them, and an update may name the version it expects.
    version = models.PositiveIntegerField(default=1, db_default=1)
    # Declared in code (``DISTSCHED["SCHEDULES"]`` or a file given to ``schedule apply``): what was last
    # applied, {"source": ..., "paused": bool} (``services.declared_schedules``); None: made by hand.
    declared = models.JSONField(null=True, blank=True, editable=False)

    objects = ScheduleQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        indexes = [
            # The tick's query: active schedules by next slot.
            models.Index(
                fields=["next_run_at"],
                name="distsched_sched_due",
                condition=Q(paused=False, next_run_at__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return self.name


_QS = TypeVar("_QS", bound=models.QuerySet)


def _literal_states(qs: _QS, states: tuple[str, ...]) -> _QS:
    """``state IN (...)`` written with literals, not parameters.

    SQLite only uses a partial index when it can prove the query implies the
    index's WHERE clause, which it cannot do through bound parameters: with
    them the claim query sorted every waiting row on each claim.
    """
    table = qs.model._meta.db_table
    literals = ", ".join(f"'{s}'" for s in states)  # fixed enum values, never user input
    return cast(_QS, qs.extra(where=[f'"{table}"."state" IN ({literals})']))  # noqa: S610 - enum literals, no input


class RunQuerySet(models.QuerySet):
    def waiting(self, now: datetime, queues: list[str] | tuple[str, ...] | None = None) -> RunQuerySet:
        """Pending or retrying runs whose time has come: highest priority first, then oldest."""
        qs = _literal_states(self, WAITING_STATES).filter(available_at__lte=now)
        if queues:
            qs = qs.filter(queue__in=list(queues))
        return qs.order_by("-priority", "available_at", "id")

    def claimable(
        self,
        now: datetime,
        queues: list[str] | tuple[str, ...] | None = None,
        excluded_tasks: list[str] | tuple[str, ...] = (),
    ) -> RunQuerySet:
        """``waiting`` runs a worker may claim: not in a paused queue, not of a task whose required
        capabilities it lacks (``services.capabilities``; the rules ``db.claims`` states too)."""
        column = f'"{self.model._meta.db_table}"."queue"'
        qs = self.waiting(now, queues).extra(where=[not_paused_sql(column)])  # noqa: S610
        if excluded_tasks:
            qs = qs.exclude(task_name__in=list(excluded_tasks))
        return cast(RunQuerySet, qs)

    def lease_expired(self, now: datetime, queues: list[str] | tuple[str, ...] | None = None) -> RunQuerySet:
        """Leased or running runs whose owner missed its lease deadline."""
        qs = _literal_states(self, LEASED_STATES).filter(lease_expires_at__lte=now)
        if queues:
            qs = qs.filter(queue__in=list(queues))
        return qs.order_by("lease_expires_at", "id")

    def active(self) -> RunQuerySet:
        return self.filter(state__in=ACTIVE_STATES)

    def terminal(self) -> RunQuerySet:
        return self.filter(state__in=TERMINAL_STATES)


class Run(models.Model):
    # No separate FK index: "distsched_run_sched_id" (schedule, -id) covers it,
    # and every index costs a write per generated run.
    # None for an enqueued run: it belongs to no schedule; and for a run whose schedule was deleted
    # (its history outlives the schedule: ``deleted_schedule`` keeps the name).
    schedule = models.ForeignKey(
        Schedule, on_delete=models.SET_NULL, related_name="runs", db_index=False, null=True, blank=True
    )
    task_name = models.CharField(max_length=200)
    args = StorableJSONField(default=list, blank=True)
    kwargs = StorableJSONField(default=dict, blank=True)
    state = models.CharField(max_length=10, choices=RunState.choices, default=RunState.PENDING)
    # The slot this run stands for; never changes, so it keys the run's identity.
    scheduled_for = models.DateTimeField()
    # When the run may next be claimed: the slot, or the end of a retry backoff.
    available_at = models.DateTimeField()
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=3)
    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    result = StorableJSONField(null=True, blank=True)
    queue = models.CharField(max_length=100, default="default")
    origin = models.CharField(max_length=10, choices=Origin.choices, default=Origin.SCHEDULE)
    idempotency_key = models.CharField(max_length=255)
    cancel_requested = models.BooleanField(default=False)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    # Claims take higher priorities first (-100..100); a database default, so bulk inserts may omit it.
    priority = models.SmallIntegerField(default=0, db_default=0)
    # The retry policy of a run without a schedule ({"attempts", "base", "cap", "jitter"}); else the schedule's.
    retry_policy = StorableJSONField(null=True, blank=True)
    # Unique enqueue: at most one active (not finished) run per task and key, enforced by a partial unique index.
    unique_key = models.CharField(max_length=255, blank=True, default="", db_default="")
    # OpenTelemetry: the trace context of the code that enqueued or triggered the run (the
    # propagator's carrier, e.g. {"traceparent": "00-..."}); its execution span continues that trace.
    trace_context = models.JSONField(null=True, blank=True, editable=False)
    # Flow control (``services.limits``): the partition of each limit the run is under, {limit: key},
    # computed once (at its first admission) and kept by retries and requeues; None: not yet admitted
    # under any limit.
    limit_keys = models.JSONField(null=True, blank=True, editable=False)
    # What a blocked (or rate-throttled) run waits for: "limit:<name>:<partition key>" or "run:<id>"
    # (overlap=replace: the run it replaces); "" otherwise.
    held_by = models.CharField(max_length=400, blank=True, default="", db_default="", editable=False)
    # The version of its schedule that made it (tick, trigger: copied from the schedule row in the
    # INSERT); None for an enqueued run.
    schedule_version = models.PositiveIntegerField(null=True, blank=True, editable=False)
    # The name of its schedule once that schedule is deleted (the foreign key is then null); None
    # otherwise. Nullable, not "": so adding it is an ALTER TABLE ADD COLUMN on SQLite, not a rebuild
    # of the runs table.
    deleted_schedule = models.CharField(max_length=100, null=True, blank=True, editable=False)  # noqa: DJ001
    # The workflow the run is a node of (``workflow_models``); None for every other run, which is
    # all the outcome paths look at before doing any workflow work (no query).
    workflow = models.ForeignKey(
        "distsched_app.Workflow", on_delete=models.PROTECT, related_name="runs", db_index=False, null=True,
        blank=True, editable=False,
    )  # fmt: skip
    # The alias of the task-framework backend (``TASKS``) that enqueued it; None for a run that no
    # framework backend wrote (schedules, ``run enqueue``, the API). Nullable for the same reason.
    backend = models.CharField(max_length=100, null=True, blank=True, editable=False)  # noqa: DJ001

    objects = RunQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        permissions = [("view_metrics", "Can view the Prometheus metrics at /metrics")]
        constraints = [
            # Two tickers can never generate the same slot twice.
            models.UniqueConstraint(
                fields=["schedule", "scheduled_for"],
                condition=Q(origin="schedule"),
                name="distsched_run_unique_slot",
            ),
            # Unique enqueue: while a run of a task with this key is not finished, no second one of that
            # task (keys are the task's own: another task's run with the same key is no duplicate).
            models.UniqueConstraint(
                fields=["task_name", "unique_key"],
                condition=Q(state__in=["pending", "leased", "running", "retrying", "blocked"]) & ~Q(unique_key=""),
                name="distsched_run_unique_active_key",
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=MIN_PRIORITY, priority__lte=MAX_PRIORITY), name="distsched_run_priority"
            ),
        ]
        indexes = [
            # The claim query: waiting runs by queue, priority (highest first) and due time.
            models.Index(
                fields=["queue", "-priority", "available_at", "id"],
                name="distsched_run_waiting",
                condition=Q(state__in=["pending", "retrying"]),
            ),
            # Lease recovery: leased/running runs by deadline.
            models.Index(
                fields=["lease_expires_at", "id"],
                name="distsched_run_leased",
                condition=Q(state__in=["leased", "running"]),
            ),
            # Release of a limit's slot: its blocked runs, in the order they are let through.
            models.Index(
                fields=["held_by", "-priority", "available_at", "id"],
                name="distsched_run_blocked",
                condition=Q(state="blocked"),
            ),
            # Lists filtered by state, newest first.
            models.Index(fields=["state", "-id"], name="distsched_run_state_id"),
            # Counts by state, queue and origin (stats, metrics, dashboard), read from this index alone.
            models.Index(fields=["state", "queue", "origin"], name="distsched_run_state_queue"),
            # A schedule's runs, newest first. Partial: enqueued runs (no schedule) do not write it.
            models.Index(
                fields=["schedule", "-id"], name="distsched_run_sched_id", condition=Q(schedule__isnull=False)
            ),
            # The run list filtered by one column, newest first (``GET /api/runs?task_name=|queue=|origin=|
            # priority=``, the admin's filters): a walk of the primary key would read the whole table for a
            # rare or unknown value. Priority: only the runs off the default (0), whose list is the one a
            # walk of the primary key cannot serve; the filter repeats the condition so SQLite uses it.
            models.Index(fields=["task_name", "-id"], name="distsched_run_task_id"),
            models.Index(fields=["queue", "-id"], name="distsched_run_queue_id"),
            models.Index(fields=["origin", "-id"], name="distsched_run_origin_id"),
            models.Index(fields=["priority", "-id"], name="distsched_run_prio_id", condition=~Q(priority=0)),
            # Runs of a deleted schedule by its name (``?schedule=<name>`` once the schedule is gone).
            models.Index(
                fields=["deleted_schedule", "-id"],
                name="distsched_run_deleted_sched",
                condition=Q(deleted_schedule__isnull=False),
            ),
            # Finished runs only (prune, recent durations): pending inserts skip it.
            models.Index(fields=["finished_at"], name="distsched_run_finished", condition=Q(finished_at__isnull=False)),
            # Retention, per final state: its oldest finished runs first, and no other state's.
            models.Index(
                fields=["state", "finished_at"],
                name="distsched_run_state_finished",
                condition=Q(finished_at__isnull=False),
            ),
            # A workflow's unfinished nodes ("has it ended?", cancel): other runs never enter it.
            models.Index(
                fields=["workflow"],
                name="distsched_run_wf_active",
                condition=Q(workflow__isnull=False, state__in=["pending", "leased", "running", "retrying", "blocked"]),
            ),
            # No index on idempotency_key (dropped in 0026): nothing looks a run up by it, and the admin's
            # search ORs it with last_error ILIKE, which reads the table anyway. It cost every run an entry.
            # The run list sorted by a time column (admin), and the kwargs search's time bound on scheduled_for.
            models.Index(fields=["scheduled_for", "id"], name="distsched_run_sched_for"),
            # Sorted by started: the runs that never started last either way (the admin asks for
            # started_at ASC NULLS FIRST / DESC NULLS LAST, SQLite's own order), so the newest started
            # come first without walking past the unstarted ones (issue 21: 124,000 at 11M runs).
            NullsOrderedIndex(F("started_at").desc(nulls_last=True), F("id").desc(), name="distsched_run_started_desc"),
        ]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.task_name}, {self.state})"

    @property
    def fencing_token(self) -> str:
        return f"{self.pk}:{self.attempts}"


class Liveness(models.TextChoices):
    """What a worker row says of its process, read at ``now`` (never stored)."""

    ALIVE = "alive", "alive"  # not stopped, heartbeat within STALE_AFTER_SECONDS
    STALE = "stale", "stale"  # not stopped, but silent for longer: probably dead
    STOPPED = "stopped", "stopped"  # said so on its way out


def _stale_before(now: datetime) -> datetime:
    """The liveness rule's one cutoff: a heartbeat older than this is stale."""
    return now - timedelta(seconds=conf.STALE_AFTER_SECONDS)


def schedule_name_of(run: Run) -> str | None:
    """The name of the run's schedule (None for an enqueued run), from the ``schedule_name``
    annotation of list queries when present, else from the schedule row, else the name the run
    kept when its schedule was deleted."""
    name = getattr(run, "schedule_name", None)
    if name is not None:
        return name
    if run.schedule_id is not None and run.schedule is not None:
        return run.schedule.name
    return run.deleted_schedule or None


class WorkerQuerySet(models.QuerySet):
    """The liveness rule as row sets; ``Worker.liveness`` is the same rule for one row."""

    def stopped(self) -> WorkerQuerySet:
        return self.filter(status=WorkerStatus.STOPPED)

    def not_stopped(self) -> WorkerQuerySet:
        """Alive or stale: the workers that have not said they stopped."""
        return self.exclude(status=WorkerStatus.STOPPED)

    def stale(self, now: datetime) -> WorkerQuerySet:
        """Not stopped, but silent for longer than ``STALE_AFTER_SECONDS``."""
        return self.not_stopped().filter(heartbeat_at__lt=_stale_before(now))

    def alive(self, now: datetime) -> WorkerQuerySet:
        """Not stopped, heartbeat within ``STALE_AFTER_SECONDS``."""
        return self.not_stopped().filter(heartbeat_at__gte=_stale_before(now))

    def liveness_counts(self, now: datetime) -> dict[str, int]:
        """Workers by liveness (every ``Liveness`` value a key), in one aggregate query."""
        cutoff = _stale_before(now)
        live = ~Q(status=WorkerStatus.STOPPED)
        return self.aggregate(
            **{
                Liveness.ALIVE.value: models.Count("worker_id", filter=live & Q(heartbeat_at__gte=cutoff)),
                Liveness.STALE.value: models.Count("worker_id", filter=live & Q(heartbeat_at__lt=cutoff)),
                Liveness.STOPPED.value: models.Count("worker_id", filter=Q(status=WorkerStatus.STOPPED)),
            }
        )


class Worker(models.Model):
    worker_id = models.CharField(max_length=200, primary_key=True)
    hostname = models.CharField(max_length=255, blank=True, default="")
    pid = models.PositiveIntegerField(null=True, blank=True)
    queues = StorableJSONField(default=list, blank=True)
    # What it offers (runworker --capability): runs of a task in TASK_REQUIRES need all of theirs.
    capabilities = StorableJSONField(default=list, blank=True)
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    status = models.CharField(max_length=10, choices=WorkerStatus.choices, default=WorkerStatus.ACTIVE)
    current_run = models.ForeignKey(
        Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_constraint=False
    )
    clock_skew_seconds = models.FloatField(null=True, blank=True)
    runs_executed = models.PositiveBigIntegerField(default=0)
    # The task names it has registered (published at start): explain and metrics tell a run no live
    # worker can execute (a rolling deploy's new task). None: a worker that did not publish them.
    tasks = StorableJSONField(null=True, blank=True, default=None)

    objects = WorkerQuerySet.as_manager()

    class Meta:
        ordering = ["worker_id"]

    def __str__(self) -> str:
        return self.worker_id

    def liveness(self, now: datetime) -> Liveness:
        """``WorkerQuerySet``'s rule for this row: stopped, else stale or alive by heartbeat age."""
        if self.status == WorkerStatus.STOPPED:
            return Liveness.STOPPED
        return Liveness.STALE if self.heartbeat_at < _stale_before(now) else Liveness.ALIVE


class RunEvent(models.Model):
    """Append-only history of a run; written only by ``services.events``."""

    # Covered by "distsched_event_run" (run, id); see Run.schedule.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events", db_index=False)
    event_type = models.CharField(max_length=20, choices=EventType.choices)
    message = models.TextField(blank=True, default="")
    worker_id = models.CharField(max_length=200, blank=True, default="")
    attempt = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField()
    # A failed attempt's exception, for django.tasks' TaskError: {"exception_class_path", "traceback"}.
    data = StorableJSONField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["run", "id"], name="distsched_event_run"),
            models.Index(fields=["event_type", "created_at"], name="distsched_event_type_time"),
        ]

    def __str__(self) -> str:
        return f"{self.event_type} (run {self.run_id})"
