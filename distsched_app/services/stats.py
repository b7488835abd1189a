"""Read-only figures for operators: the same numbers behind API, admin, CLI and metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Avg, Count, DurationField, ExpressionWrapper, F, Q

from ..conf import conf
from ..models import EventType, Run, RunEvent, RunState, Schedule, Worker, WorkerStatus

RECENT = timedelta(hours=24)


@dataclass(frozen=True, kw_only=True)
class RecentFailure:
    run_id: int
    task_name: str
    attempt: int
    message: str
    at: datetime


@dataclass(frozen=True, kw_only=True)
class Stats:
    runs_by_state: dict[str, int]
    schedules_total: int
    schedules_paused: int
    schedules_overdue: int
    workers_alive: int
    workers_stale: int
    workers_stopped: int
    mean_duration_seconds: float | None
    retries_last_24h: int
    failures_last_24h: int
    recent_failures: list[RecentFailure] = field(default_factory=list)

    def as_dict(self) -> dict:
        from dataclasses import asdict

        data = asdict(self)
        for failure in data["recent_failures"]:
            failure["at"] = failure["at"].isoformat()
        return data


def runs_by_state() -> dict[str, int]:
    counts = {state: 0 for state in RunState.values}
    for row in Run.objects.order_by().values("state").annotate(n=Count("id")):
        counts[row["state"]] = row["n"]
    return counts


def stats(*, now: datetime, recent_failures: int = 10) -> Stats:
    since = now - RECENT
    schedule_counts = Schedule.objects.aggregate(total=Count("id"), paused=Count("id", filter=Q(paused=True)))
    overdue = Schedule.objects.overdue(now, conf.MISFIRE_GRACE_SECONDS).count()
    stale_cutoff = now - timedelta(seconds=conf.STALE_AFTER_SECONDS)
    live = ~Q(status=WorkerStatus.STOPPED)
    workers = Worker.objects.aggregate(
        stopped=Count("worker_id", filter=Q(status=WorkerStatus.STOPPED)),
        alive=Count("worker_id", filter=live & Q(heartbeat_at__gte=stale_cutoff)),
        stale=Count("worker_id", filter=live & Q(heartbeat_at__lt=stale_cutoff)),
    )
    duration = ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField())
    mean = (
        Run.objects.filter(state=RunState.SUCCEEDED, finished_at__gte=since, started_at__isnull=False)
        .aggregate(mean=Avg(duration))["mean"]
    )
    event_counts = {
        row["event_type"]: row["n"]
        for row in RunEvent.objects.filter(
            created_at__gte=since, event_type__in=[EventType.RETRY_SCHEDULED, EventType.FAILED]
        ).order_by().values("event_type").annotate(n=Count("id"))
    }
    failures = [
        RecentFailure(run_id=e.run_id, task_name=e.run.task_name, attempt=e.attempt, message=e.message[:500],
                      at=e.created_at)
        for e in RunEvent.objects.filter(event_type=EventType.FAILED).select_related("run")
        .order_by("-id")[:recent_failures]
    ]
    return Stats(
        runs_by_state=runs_by_state(),
        schedules_total=schedule_counts["total"],
        schedules_paused=schedule_counts["paused"],
        schedules_overdue=overdue,
        workers_alive=workers["alive"],
        workers_stale=workers["stale"],
        workers_stopped=workers["stopped"],
        mean_duration_seconds=mean.total_seconds() if mean is not None else None,
        retries_last_24h=event_counts.get(EventType.RETRY_SCHEDULED, 0),
        failures_last_24h=event_counts.get(EventType.FAILED, 0),
        recent_failures=failures,
    )
