"""Read-only figures for operators: the same numbers behind API, admin, CLI and metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.core.cache import cache
from django.db import models
from django.db.models import Avg, Count, F, Q

from ..clock import iso_utc
from ..conf import conf
from ..db import server
from ..db.expressions import Microseconds
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
            failure["at"] = iso_utc(failure["at"])
        return data


BIG_TERMINAL_STATES = (RunState.SUCCEEDED, RunState.CANCELLED, RunState.SKIPPED)
"""States that grow with all history: the only counts that may come from the short-lived cache."""
BIG_TERMINAL_CACHE_KEY = "distsched:stats:big-terminal-run-counts"
BIG_TERMINAL_CACHE_SECONDS = 10
BIG_TERMINAL_CACHE_ABOVE = 100_000
"""PostgreSQL caches the big terminal counts only above this many such runs (below, counting is cheap)."""


def _counts(qs: models.QuerySet) -> dict[tuple[str, str], int]:
    return {(row["state"], row["queue"]): row["n"]
            for row in qs.order_by().values("state", "queue").annotate(n=Count("*"))}


def run_counts() -> dict[tuple[str, str], int]:
    """Runs by ``(state, queue)``, read from the ``(state, queue)`` index alone (no table row).

    Active states and dead are always exact (a range of the index of a few
    percent of the runs). The big terminal states (succeeded, cancelled,
    skipped) are exact too, except on PostgreSQL with more than
    ``BIG_TERMINAL_CACHE_ABOVE`` of them: counting 900,000 index entries there
    costs ~90 ms, so that figure is kept in the Django cache for at most
    ``BIG_TERMINAL_CACHE_SECONDS`` (it is still counted from the database, just
    at most 10 s ago). SQLite counts them in ~70 ms and never caches.
    """
    counts = _counts(Run.objects.filter(state__in=[s for s in RunState.values if s not in BIG_TERMINAL_STATES]))
    big = cache.get(BIG_TERMINAL_CACHE_KEY)
    if big is None:
        big = _counts(Run.objects.filter(state__in=BIG_TERMINAL_STATES))
        if server.counts_are_costly() and sum(big.values()) > BIG_TERMINAL_CACHE_ABOVE:
            cache.set(BIG_TERMINAL_CACHE_KEY, big, BIG_TERMINAL_CACHE_SECONDS)
    return counts | big


def runs_by_state(counts: dict[tuple[str, str], int] | None = None) -> dict[str, int]:
    by_state = {state: 0 for state in RunState.values}
    for (state, _), n in (run_counts() if counts is None else counts).items():
        by_state[state] += n
    return by_state


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
    # The finished_at index bounds this to the last 24 hours of runs. The state is a
    # FILTER, not a WHERE: with state = 'succeeded' in the WHERE, SQLite walked the
    # state index over every succeeded run ever.
    mean = (
        Run.objects.filter(finished_at__gte=since, started_at__isnull=False)
        .aggregate(mean=Avg(Microseconds(F("finished_at"), F("started_at")),
                            filter=Q(state=RunState.SUCCEEDED)))["mean"]
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
        # Newest first along the (event_type, created_at) index: ordering by -id alone
        # sorted every failed event ever recorded.
        for e in RunEvent.objects.filter(event_type=EventType.FAILED).select_related("run")
        .order_by("-created_at", "-id")[:recent_failures]
    ]
    return Stats(
        runs_by_state=runs_by_state(),
        schedules_total=schedule_counts["total"],
        schedules_paused=schedule_counts["paused"],
        schedules_overdue=overdue,
        workers_alive=workers["alive"],
        workers_stale=workers["stale"],
        workers_stopped=workers["stopped"],
        mean_duration_seconds=mean / 1_000_000 if mean is not None else None,
        retries_last_24h=event_counts.get(EventType.RETRY_SCHEDULED, 0),
        failures_last_24h=event_counts.get(EventType.FAILED, 0),
        recent_failures=failures,
    )
