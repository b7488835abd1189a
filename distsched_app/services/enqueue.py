"""Enqueued runs: work started by code rather than by the calendar.

A run enqueued here is a run like any other (leases, fencing, retries with
backoff, dead, cancel/requeue, events, prune), with no schedule: its origin
is ``enqueued``, it carries its own retry policy and a ``priority``. The run and
its ``created`` event are written in the caller's transaction (``db.runs``),
so a rollback leaves no run and a commit can never lose one; no worker can
see it before the commit. Everything is validated first: nothing half-written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cached_property, lru_cache
from typing import Any

from .. import tracing
from ..backoff import RetryPolicy
from ..conf import RANGES, conf
from ..db import runs as db_runs
from ..errors import ValidationError
from ..models import ACTIVE_STATES, MAX_PRIORITY, MIN_PRIORITY, Origin, Run, RunState
from ..registry import registry
from ..text import storable
from . import limit_rules, task_options
from .events import MAX_MESSAGE_CHARS
from .validation import (
    MAX_ATTEMPTS_LIMIT,
    bounded_float,
    bounded_int,
    check_storable,
    parse_datetime,
    validate_queue,
    validate_task_name,
    validate_task_queue,
    validated_json,
)

UNIQUE_KEY_MAX = 255
ENQUEUED_MESSAGE = "enqueued"
# A duplicate unique key whose run finishes between our INSERT and our SELECT: insert again.
UNIQUE_RETRIES = 3
# The retry options of an enqueued run, as callers name them (validate_policy's keys, policy_fields' output).
POLICY_FIELDS = ("max_attempts", "retry_base_seconds", "retry_max_seconds", "retry_jitter")


def default_policy() -> RetryPolicy:
    """The retry policy of an enqueued run when its caller gives none: the DISTSCHED defaults."""
    return RetryPolicy(max_attempts=conf.MAX_ATTEMPTS, base=conf.RETRY_BASE_SECONDS, cap=conf.RETRY_MAX_SECONDS)


def validate_policy(data: dict[str, Any], *, base: RetryPolicy | None = None) -> RetryPolicy:
    """``{"max_attempts", "retry_base_seconds", "retry_max_seconds", "retry_jitter"}`` (each optional;
    what is left out is ``base``'s, by default the DISTSCHED defaults)."""
    unknown = set(data) - set(POLICY_FIELDS)
    if unknown:
        raise ValidationError(f"unknown retry option(s): {', '.join(sorted(unknown))}", field="retry")
    base_default = base or default_policy()
    policy = RetryPolicy(
        max_attempts=bounded_int(
            data.get("max_attempts", base_default.max_attempts), field="max_attempts", low=1, high=MAX_ATTEMPTS_LIMIT
        ),
        base=bounded_float(
            data.get("retry_base_seconds", base_default.base),
            field="retry_base_seconds",
            low=0,
            high=RANGES["RETRY_BASE_SECONDS"][2],
        ),
        cap=bounded_float(
            data.get("retry_max_seconds", base_default.cap),
            field="retry_max_seconds",
            low=0,
            high=RANGES["RETRY_MAX_SECONDS"][2],
        ),
        jitter=bounded_float(data.get("retry_jitter", base_default.jitter), field="retry_jitter", low=0, high=1),
    )
    if policy.cap < policy.base:
        raise ValidationError("retry_max_seconds must be at least retry_base_seconds", field="retry_max_seconds")
    return policy


def policy_fields(policy: RetryPolicy) -> dict[str, float]:
    """``validate_policy``'s input for ``policy``: how the API, the CLI and the admin show it."""
    return dict(zip(POLICY_FIELDS, (policy.max_attempts, policy.base, policy.cap, policy.jitter), strict=True))


def own_policy(run: Run) -> RetryPolicy | None:
    """The retry policy a run carries itself (an enqueued run's); None for a run that follows its
    schedule's, or whose stored policy is unreadable (written by hand), so a screen never fails on it."""
    if not run.retry_policy:
        return None
    try:
        return RetryPolicy.from_json(run.retry_policy)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


@dataclass(frozen=True, kw_only=True)
class Job:
    """One run to enqueue, as a caller describes it."""

    task_name: str
    args: Sequence[Any] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    queue: str | None = None  # None: the task's declared queue (``declared``), else "default"
    priority: int | None = None  # None: the task's declared priority, else 0
    run_after: datetime | None = None
    unique_key: str = ""
    backend: str | None = None  # the TASKS alias of the framework backend enqueuing it (kept on the run)


def _validated(
    job: Job, *, policy: RetryPolicy | None, now: datetime, declared_of: Callable[[str], Declared] | None = None
) -> db_runs.NewRun:
    """The run to write; what the job and ``policy`` leave out (None) is the task's declaration's."""
    validate_task_name(job.task_name)
    if job.queue is None or job.priority is None or policy is None:
        d = (declared_of or declared)(job.task_name)
        job = replace(
            job,
            queue=d.queue if job.queue is None else job.queue,
            priority=d.priority if job.priority is None else job.priority,
        )
        policy = policy or d.policy or default_policy()
    args, args_json = validated_json(job.args, field="args")
    kwargs, kwargs_json = validated_json(job.kwargs, field="kwargs")
    run_after = parse_datetime(job.run_after, field="run_after")
    if not isinstance(job.unique_key, str) or len(job.unique_key) > UNIQUE_KEY_MAX:
        raise ValidationError(f"unique_key must be a string of at most {UNIQUE_KEY_MAX} characters", field="unique_key")
    if job.unique_key and not job.unique_key.strip():
        # "" means no key; "  " is almost always a key built from a missing value, not a choice.
        raise ValidationError("unique_key must not be blank (give a key, or none at all)", field="unique_key")
    check_storable(job.unique_key, field="unique_key")
    queue = validate_queue(job.queue)
    if conf.LIMITS:  # a run under a limit with missing="error" must carry its partition key
        limit_rules.keys_for(job.task_name, queue, args, kwargs)
    return db_runs.NewRun(
        task_name=job.task_name,
        args=args,
        kwargs=kwargs,
        args_json=args_json,
        kwargs_json=kwargs_json,
        scheduled_for=run_after or now,
        max_attempts=policy.max_attempts,
        queue=queue,
        priority=bounded_int(job.priority, field="priority", low=MIN_PRIORITY, high=MAX_PRIORITY),
        retry_policy=policy.as_json(),
        unique_key=job.unique_key,
        backend=job.backend,
    )


def _run(run_id: int, new: db_runs.NewRun, *, now: datetime) -> Run:
    """The Run just written, built from what was written (no SELECT; a model instance costs
    as much as the INSERT, so ``Enqueued`` builds it only when an adapter asks)."""
    run = Run(
        pk=run_id, schedule=None, task_name=new.task_name, args=new.args, kwargs=new.kwargs,
        state=RunState.PENDING, scheduled_for=new.scheduled_for, available_at=new.scheduled_for, attempts=0,
        max_attempts=new.max_attempts, queue=new.queue, origin=Origin.ENQUEUED,
        idempotency_key=f"{Origin.ENQUEUED.value}:{run_id}", created_at=now, updated_at=now,
        priority=new.priority, retry_policy=new.retry_policy, unique_key=new.unique_key,
        trace_context=new.trace_context, backend=new.backend,
    )  # fmt: skip
    run._state.adding = False
    run._state.db = "default"
    return run


class Enqueued:
    """What one enqueue did: a run written (``created``), or, its unique key being taken, the
    active run found. It reads like a run (``pk``, ``state``, ``created_at``, ``args``, ...)
    for ``task_results``; ``run`` is the model instance."""

    def __init__(self, *, run_id: int, new: db_runs.NewRun | None, now: datetime, existing: Run | None = None):
        self.pk = run_id
        self.created = existing is None
        self._new, self._now, self._existing = new, now, existing
        source: Any = existing if existing is not None else new
        self.args, self.kwargs = source.args, source.kwargs
        self.state = existing.state if existing is not None else RunState.PENDING
        self.created_at = existing.created_at if existing is not None else now
        self.finished_at = existing.finished_at if existing is not None else None
        self.result = existing.result if existing is not None else None

    @cached_property
    def run(self) -> Run:
        if self._existing is not None:
            return self._existing
        assert self._new is not None  # noqa: S101 - set whenever there is no existing run
        return _run(self.pk, self._new, now=self._now)


def enqueue(job: Job, *, now: datetime, policy: RetryPolicy | None = None, message: str = ENQUEUED_MESSAGE) -> Enqueued:
    """Write one run and its ``created`` event in the current transaction (at most two
    INSERTs, one statement on PostgreSQL). With a ``unique_key`` held by an active run of the
    same task, nothing is written and that run is returned. ``message`` is the event's (who enqueued it)."""
    new = _validated(job, policy=policy, now=now)
    message = storable(message, MAX_MESSAGE_CHARS)
    with tracing.producer(lambda: _producer_span(new)) as span:
        context = tracing.carrier()
        enqueued = _insert(new if context is None else replace(new, trace_context=context), now=now, message=message)
        span.set("messaging.message.id", str(enqueued.pk))
        span.set("distsched.run.created", enqueued.created)
        return enqueued


def _producer_span(new: db_runs.NewRun) -> tuple[str, dict[str, str | int]]:
    return f"enqueue {new.task_name}", {
        "messaging.operation.type": "send",
        "messaging.destination.name": new.queue,
        "distsched.task": new.task_name,
        "distsched.priority": new.priority,
    }


def _insert(new: db_runs.NewRun, *, now: datetime, message: str) -> Enqueued:
    for _ in range(UNIQUE_RETRIES):
        run_id = db_runs.insert_enqueued(new, now=now, message=message)
        if run_id is not None:
            return Enqueued(run_id=run_id, new=new, now=now)
        existing = Run.objects.filter(
            task_name=new.task_name, unique_key=new.unique_key, state__in=ACTIVE_STATES
        ).first()  # the key is the task's own: the constraint is (task_name, unique_key)
        if existing is not None:
            return Enqueued(run_id=existing.pk, new=None, now=now, existing=existing)
    raise ValidationError(f"unique_key {new.unique_key!r} is taken and released over and over", field="unique_key")


@dataclass(frozen=True)
class Declared:
    """What a task's declaration says about its runs: a framework task's ``@task(queue_name=...,
    priority=...)`` and its backend's ``OPTIONS`` (retry policy); for a plain registered task, the
    defaults. Its backend's ``QUEUES`` are ``validation.validate_task_queue``'s."""

    queue: str = "default"
    priority: int = 0
    policy: RetryPolicy | None = None  # None: the DISTSCHED defaults


def declared(task_name: str) -> Declared:
    """With its options (``task_options``: TASK_OPTIONS over ``@task``'s keywords) over them."""
    entry = registry.find(task_name)
    task = entry.framework_task if entry is not None else None
    if task is None:
        return with_options(task_name, Declared())
    try:
        backend = task.get_backend()
    except Exception:  # noqa: BLE001 - an alias no longer in TASKS: the task's own declaration still holds
        backend = None
    policy = getattr(backend, "policy", None)
    return with_options(
        task_name,
        Declared(
            queue=task.queue_name, priority=task.priority, policy=policy if isinstance(policy, RetryPolicy) else None
        ),
    )


def declared_priority(task_name: str) -> int:
    """The priority a run of the task takes when nothing else says one (a schedule's slots and
    triggers: schedules have no priority of their own); 0 if its declaration cannot be read. A
    framework task outside an app's ``tasks`` module is looked up as a worker would find it."""
    from ..task_import import import_framework_task

    try:
        import_framework_task(task_name, registry)
        return declared(task_name).priority
    except Exception:  # noqa: BLE001 - an invalid option (the system check reports it) never stops a tick
        return 0


def with_options(task_name: str, framework: Declared) -> Declared:
    """``framework`` (a framework task's ``queue_name``, ``priority`` and backend policy; else the
    defaults) completed by the task's options: a queue or priority left at the framework's default
    ("default", 0) takes the option's, and each retry field given in the options replaces the
    policy's. A framework task's explicit ``queue_name``/``priority`` (its decorator, ``using()``)
    is the call's own choice and stays."""
    options = task_options.merged(task_name)
    if not options:
        return framework
    queue, priority = framework.queue, framework.priority
    if queue == "default" and isinstance(options.get("queue"), str):
        queue = options["queue"]
    if priority == 0 and options.get("priority") is not None:
        priority = options["priority"]
    retry = {k: options[k] for k in task_options.POLICY_KEYS if k in options}
    policy = validate_policy(retry, base=framework.policy) if retry else framework.policy
    return Declared(queue=queue, priority=priority, policy=policy)


def enqueue_declared(
    *,
    task_name: str,
    now: datetime,
    message: str,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    queue: str | None = None,
    priority: int | None = None,
    run_after: datetime | None = None,
    unique_key: str = "",
    retry: dict[str, Any] | None = None,
) -> Enqueued:
    """An operator's enqueue (``POST /api/runs``, ``distsched run enqueue``): what the request leaves
    out comes from the task's declaration, so a framework task posted by hand lands where its own
    ``enqueue()`` would put it, with its backend's retry policy; ``retry`` overrides single fields."""
    validate_task_name(task_name)
    d = declared(task_name)
    queue = validate_task_queue(task_name, d.queue if queue is None else queue)
    job = Job(
        task_name=task_name, args=args, kwargs=kwargs or {}, queue=queue,
        priority=d.priority if priority is None else priority, run_after=run_after, unique_key=unique_key,
    )  # fmt: skip
    return enqueue(job, now=now, policy=validate_policy(retry or {}, base=d.policy), message=message)


def enqueue_many(jobs: Sequence[Job], *, now: datetime, policy: RetryPolicy | None = None) -> list[Run]:
    """Write many runs and their events at once (no unique keys): the bulk path."""
    declared_of = lru_cache(maxsize=None)(declared)  # once per task of the batch
    new = [_validated(job, policy=policy, now=now, declared_of=declared_of) for job in jobs]
    if any(n.unique_key for n in new):
        raise ValidationError(
            "unique keys are not supported by enqueue_many: enqueue those one by one", field="unique_key"
        )
    with tracing.producer(lambda: ("enqueue_many", {"messaging.batch.message_count": len(new)})):
        context = tracing.carrier()
        if context is not None:
            new = [replace(n, trace_context=context) for n in new]
        ids = db_runs.insert_enqueued_many(new, now=now, message=ENQUEUED_MESSAGE)
    return [_run(run_id, n, now=now) for run_id, n in zip(ids, new, strict=True)]
