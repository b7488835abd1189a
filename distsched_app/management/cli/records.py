"""JSON-ready dicts of schedules, runs, events and workers (the ``--json`` shapes).

Datetimes are ISO 8601 in UTC; keys match the model fields, so scripts can
rely on the names of the data model (docs/explanation/concepts.md).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ...clock import iso_utc
from ...models import Liveness, Run, RunEvent, Schedule, Worker, schedule_name_of
from ...services import enqueue


def iso(value: datetime | None) -> str | None:
    return iso_utc(value) if value is not None else None


def schedule_record(schedule: Schedule, *, upcoming: list[datetime] | None = None) -> dict[str, Any]:
    data = {
        "name": schedule.name,
        "task_name": schedule.task_name,
        "args": schedule.args,
        "kwargs": schedule.kwargs,
        "kind": schedule.kind,
        "interval_seconds": schedule.interval_seconds,
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "run_at": iso(schedule.run_at),
        "start_at": iso(schedule.start_at),
        "next_run_at": iso(schedule.next_run_at),
        "paused": schedule.paused,
        "max_attempts": schedule.max_attempts,
        "retry_base_seconds": schedule.retry_base_seconds,
        "retry_max_seconds": schedule.retry_max_seconds,
        "retry_jitter": schedule.retry_jitter,
        "catch_up": schedule.catch_up,
        "overlap": schedule.overlap,
        "queue": schedule.queue,
        "version": schedule.version,
        "declared": schedule.declared is not None,
        "created_at": iso(schedule.created_at),
        "updated_at": iso(schedule.updated_at),
    }
    if upcoming is not None:
        data["upcoming"] = [iso(t) for t in upcoming]
    return data


def spec(schedule: Schedule) -> str:
    """How a schedule recurs, in one short phrase."""
    if schedule.kind == "interval":
        return f"every {schedule.interval_seconds}s"
    if schedule.kind == "cron":
        return f"cron {schedule.cron} ({schedule.timezone})"
    return "once"


def run_record(run: Run) -> dict[str, Any]:
    return {
        "id": run.pk,
        # Lists annotate ``schedule_name`` (services.queries.runs) instead of joining the schedule row.
        "schedule": schedule_name_of(run),
        "task_name": run.task_name,
        "args": run.args,
        "kwargs": run.kwargs,
        "state": run.state,
        "queue": run.queue,
        "priority": run.priority,
        "origin": run.origin,
        "schedule_version": run.schedule_version,
        "scheduled_for": iso(run.scheduled_for),
        "available_at": iso(run.available_at),
        "attempts": run.attempts,
        "max_attempts": run.max_attempts,
        "lease_owner": run.lease_owner,
        "lease_expires_at": iso(run.lease_expires_at),
        "started_at": iso(run.started_at),
        "finished_at": iso(run.finished_at),
        "cancel_requested": run.cancel_requested,
        "idempotency_key": run.idempotency_key,
        "unique_key": run.unique_key,
        "retry_policy": retry_policy(run),
        "last_error": run.last_error,
        "result": run.result,
        "created_at": iso(run.created_at),
        "updated_at": iso(run.updated_at),
    }


def retry_policy(run: Run) -> dict[str, Any] | None:
    """An enqueued run's own retry policy, named as ``--json`` readers know it from the API; None
    for a run that follows its schedule's."""
    policy = enqueue.own_policy(run)
    return None if policy is None else enqueue.policy_fields(policy)


def event_record(event: RunEvent) -> dict[str, Any]:
    return {
        "id": event.pk,
        "event_type": event.event_type,
        "attempt": event.attempt,
        "worker_id": event.worker_id,
        "message": event.message,
        "created_at": iso(event.created_at),
    }


def worker_record(worker: Worker, *, now: datetime) -> dict[str, Any]:
    liveness = worker.liveness(now)
    return {
        "worker_id": worker.worker_id,
        "hostname": worker.hostname,
        "pid": worker.pid,
        "queues": worker.queues,
        "capabilities": worker.capabilities,
        "status": worker.status,
        "liveness": liveness.value,
        "stale": liveness == Liveness.STALE,
        "started_at": iso(worker.started_at),
        "heartbeat_at": iso(worker.heartbeat_at),
        "heartbeat_age_seconds": round((now - worker.heartbeat_at).total_seconds(), 3),
        "current_run": worker.current_run_id,
        "runs_executed": worker.runs_executed,
        "clock_skew_seconds": worker.clock_skew_seconds,
    }
