"""Read-only figures for operators: the same numbers behind API, admin, CLI and metrics.

Nothing here writes, and nothing reads the clock: every function takes ``now``.

- ``stats``: the summary (``/api/stats``, ``distsched stats``, the admin dashboard).
- ``outcomes_per_hour``, ``overdue_schedules``: the admin dashboard's chart and list.
  Outcomes are counted from the run history (``RunEvent``), not from the current
  state of runs, so a run that died and was requeued still shows its death in
  the hour it happened, and a retried attempt counts once per retry.
- ``read_snapshot``: everything one Prometheus scrape reports (``metrics``
  renders it), in ten indexed aggregate queries whatever the data: runs by
  state, queue and origin (two ranges of the ``(state, queue, origin)`` index, ~0.1 s at a
  million runs, the only cost that grows with all history; ``distsched prune``
  keeps it down; see ``run_counts`` for the 10 s cache on a large PostgreSQL),
  the oldest waiting run (the claim index), rare events of all time and
  frequent ones of the last hour (the ``(event_type, created_at)`` index), runs
  finished in the last hour (the ``finished_at`` index), workers (two),
  schedules (two) and the paused queues (a table of a few operator-made rows).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from functools import partial
from typing import Any

from django.core.cache import cache
from django.db import models
from django.db.models import Avg, Count, F, Min, Q, Sum

from ..clock import iso_utc
from ..conf import conf
from ..db.expressions import Microseconds, UTCHour
from ..models import EventType, Liveness, QueuePause, Run, RunEvent, RunState, Schedule, Worker
from . import capabilities as capability_service
from . import figures, queue_labels, unknown_tasks

RECENT = timedelta(hours=24)
SAMPLE = 20_000
"""At most this many runs, the newest, feed a figure over a window (mean duration, timing histograms):
its cost is bounded whatever the throughput."""


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


BIG_TERMINAL_STATES = (RunState.SUCCEEDED, RunState.CANCELLED, RunState.SKIPPED, RunState.DEAD)
"""The final states, which grow with all history: the only counts that may come from a stored figure
(dead too: at 3% of ten million runs, 300,000 index entries)."""
BIG_TERMINAL_FIGURE = "run_counts:big-terminal"


RunCounts = dict[tuple[str, str, str], int]
"""Runs by ``(state, queue, origin)``: the key order of the ``(state, queue, origin)`` index."""


def _counts(qs: models.QuerySet) -> RunCounts:
    rows = qs.order_by().values("state", "queue", "origin").annotate(n=Count("*"))
    return {(row["state"], row["queue"], row["origin"]): row["n"] for row in rows}


def _big_terminal_counts(now: datetime | None = None) -> RunCounts:
    return _counts(Run.objects.filter(state__in=BIG_TERMINAL_STATES))


figures.register(BIG_TERMINAL_FIGURE, _big_terminal_counts)


def _active_and_dead_counts() -> RunCounts:
    return _counts(Run.objects.filter(state__in=[s for s in RunState.values if s not in BIG_TERMINAL_STATES]))


def run_counts(now: datetime | None = None) -> RunCounts:
    """Runs by ``(state, queue, origin)``, read from the ``(state, queue, origin)`` index alone
    (no table row).

    Active states are always exact (a range of the index over the backlog). The final states
    (succeeded, cancelled, skipped, dead) grow with all history:
    counting ten million index entries takes about a second. Given ``now``, that count is a
    stored figure (``services.figures``: at most 30 s old, recomputed by the leader) once
    counting took 50 ms or more; without ``now``, or while counting is quick, it is exact.
    """
    counts = _active_and_dead_counts()
    big = _big_terminal_counts() if now is None else figures.memo(BIG_TERMINAL_FIGURE, now, _big_terminal_counts)
    return counts | big


def runs_by_state(counts: RunCounts | None = None) -> dict[str, int]:
    by_state = {state: 0 for state in RunState.values}
    for (state, _, _), n in (run_counts() if counts is None else counts).items():
        by_state[state] += n
    return by_state


def runs_by_state_and_queue(counts: RunCounts) -> dict[tuple[str, str], int]:
    """The counts summed over origins: runs by ``(state, queue)``."""
    out: dict[tuple[str, str], int] = {}
    for (state, queue, _), n in counts.items():
        out[(state, queue)] = out.get((state, queue), 0) + n
    return out


def _last_day(now: datetime) -> tuple[float | None, dict[str, int]]:
    """The mean duration (µs) of the newest ``SAMPLE`` runs succeeded in the last 24 hours (a range of the
    ``(state, finished_at)`` index, newest first, whatever the throughput), and the retries and
    failures recorded in them (the ``(event_type, created_at)`` index)."""
    since = now - RECENT
    newest = (
        Run.objects.filter(state=RunState.SUCCEEDED, finished_at__gte=since, started_at__isnull=False)
        .order_by("-finished_at")
        .values("pk")[:SAMPLE]
    )
    mean = Run.objects.filter(pk__in=newest).aggregate(mean=Avg(Microseconds(F("finished_at"), F("started_at"))))[
        "mean"
    ]
    event_counts = {
        row["event_type"]: row["n"]
        for row in RunEvent.objects.filter(
            created_at__gte=since, event_type__in=[EventType.RETRY_SCHEDULED, EventType.FAILED]
        )
        .order_by()
        .values("event_type")
        .annotate(n=Count("created_at"))
    }
    return mean, event_counts


LAST_DAY_FIGURE = "stats:last-24h"
figures.register(LAST_DAY_FIGURE, _last_day)


def stats(*, now: datetime, recent_failures: int = 10) -> Stats:
    schedule_counts = Schedule.objects.aggregate(total=Count("id"), paused=Count("id", filter=Q(paused=True)))
    overdue = Schedule.objects.overdue(now, conf.MISFIRE_GRACE_SECONDS).count()
    workers = Worker.objects.liveness_counts(now)
    stored = figures.memo_many(now, {BIG_TERMINAL_FIGURE: _big_terminal_counts, LAST_DAY_FIGURE: _last_day})
    mean, event_counts = stored[LAST_DAY_FIGURE]
    failures = [
        RecentFailure(
            run_id=e.run_id, task_name=e.run.task_name, attempt=e.attempt, message=e.message[:500], at=e.created_at
        )
        # Newest first along the (event_type, created_at) index: ordering by -id alone
        # sorted every failed event ever recorded.
        for e in RunEvent.objects.filter(event_type=EventType.FAILED)
        .select_related("run")
        .order_by("-created_at", "-id")[:recent_failures]
    ]
    return Stats(
        runs_by_state=runs_by_state(_active_and_dead_counts() | stored[BIG_TERMINAL_FIGURE]),
        schedules_total=schedule_counts["total"],
        schedules_paused=schedule_counts["paused"],
        schedules_overdue=overdue,
        workers_alive=workers[Liveness.ALIVE],
        workers_stale=workers[Liveness.STALE],
        workers_stopped=workers[Liveness.STOPPED],
        mean_duration_seconds=mean / 1_000_000 if mean is not None else None,
        retries_last_24h=event_counts.get(EventType.RETRY_SCHEDULED, 0),
        failures_last_24h=event_counts.get(EventType.FAILED, 0),
        recent_failures=failures,
    )


# ------------------------------------------------------------ the admin dashboard

# The event that ends an attempt, by the outcome it stands for (chart order, bottom up).
OUTCOME_EVENTS: dict[str, str] = {
    "succeeded": EventType.SUCCEEDED,
    "retried": EventType.RETRY_SCHEDULED,
    "dead": EventType.MARKED_DEAD,
    "cancelled": EventType.CANCELLED,
}
OUTCOMES: tuple[str, ...] = tuple(OUTCOME_EVENTS)


@dataclass(frozen=True, kw_only=True)
class HourOutcomes:
    start: datetime
    counts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def hour_floor(moment: datetime) -> datetime:
    return moment.astimezone(timezone.utc).replace(minute=0, second=0, microsecond=0)


def outcomes_per_hour(*, now: datetime, hours: int = 24) -> list[HourOutcomes]:
    """Attempts ended per UTC hour by outcome, oldest hour first; the last hour is the current one.

    Counted on the ``(event_type, created_at)`` index, whatever the number of runs; but every
    outcome event of the hours is an index entry read, a million an hour on a busy installation.
    So each closed hour is a stored figure of its own (``services.figures``: computed once, when
    it took 50 ms or more, and kept for two days: a closed hour's events do not change), and the
    open hour one the leader recomputes every 15 s (at most 30 s old).
    """
    current = hour_floor(now)
    first = current - timedelta(hours=hours - 1)
    closed = {_hour_key(first + timedelta(hours=i)): first + timedelta(hours=i) for i in range(hours - 1)}

    def compute_missing(keys: list[str]) -> dict[str, dict[str, int]]:
        starts = [closed[key] for key in keys]
        by_hour = _outcomes_by_hour(min(starts), current, starts)
        return {key: by_hour[closed[key]] for key in keys}

    stored = figures.memo_batch(now, list(closed), compute_missing, max_age=CLOSED_HOUR_SECONDS)
    start, counts = figures.memo(OPEN_HOUR_FIGURE, now, _open_hour)
    if start != current:  # stored in the previous hour: this one has just begun
        start, counts = _open_hour(now)
    return [HourOutcomes(start=h, counts=stored[key]) for key, h in closed.items()] + [
        HourOutcomes(start=current, counts=counts)
    ]


def _outcomes_by_hour(start: datetime, end: datetime, hours: list[datetime]) -> dict[datetime, dict[str, int]]:
    """Outcome counts of ``hours`` (UTC hour starts), from one grouped query over [start, end)."""
    outcome_of = {event: outcome for outcome, event in OUTCOME_EVENTS.items()}
    rows = (
        RunEvent.objects.filter(event_type__in=list(outcome_of), created_at__gte=start, created_at__lt=end)
        .annotate(hour=UTCHour("created_at"))
        .order_by()
        .values("hour", "event_type")
        .annotate(n=Count("created_at"))
    )
    buckets = {h: dict.fromkeys(OUTCOMES, 0) for h in hours}
    for row in rows:
        bucket = buckets.get(hour_floor(row["hour"]))
        if bucket is not None:
            bucket[outcome_of[row["event_type"]]] += row["n"]
    return buckets


OPEN_HOUR_FIGURE = "dashboard:outcomes-open-hour"
CLOSED_HOUR_SECONDS = 2 * 86400.0
"""A closed hour's outcome counts are kept this long (the chart shows 24 hours)."""


def _hour_key(start: datetime) -> str:
    return f"dashboard:outcomes-hour:{iso_utc(start)}"


def _closed_hour(start: datetime, now: datetime) -> dict[str, int]:
    return _outcomes_by_hour(start, start + timedelta(hours=1), [start])[start]


def _open_hour(now: datetime) -> tuple[datetime, dict[str, int]]:
    """The open hour's counts; on the leader's refresh also the hour that just closed, so no
    reader pays for it."""
    current = hour_floor(now)
    previous = current - timedelta(hours=1)
    figures.memo(_hour_key(previous), now, partial(_closed_hour, previous), max_age=CLOSED_HOUR_SECONDS)
    return current, _outcomes_by_hour(current, now + timedelta(microseconds=1), [current])[current]


figures.register(OPEN_HOUR_FIGURE, _open_hour)


def overdue_schedules(*, now: datetime, limit: int = 20) -> list[Schedule]:
    """Active schedules due for longer than the misfire grace: no ticker is running.

    The same definition as ``stats.schedules_overdue`` and the metrics gauge.
    """
    qs = Schedule.objects.overdue(now, conf.MISFIRE_GRACE_SECONDS).order_by("next_run_at", "id")
    return list(qs.only("id", "name", "task_name", "next_run_at")[:limit])


# ------------------------------------------------------------ the metrics snapshot

WINDOW = timedelta(hours=1)
"""Durations, start lags and claim latencies describe runs finished in this window; event counts likewise."""

COUNTED_EVENTS: tuple[str, ...] = (
    EventType.MARKED_DEAD,
    EventType.FAILED,
    EventType.RETRY_SCHEDULED,
    EventType.LEASE_EXPIRED,
)
"""Rare events, so counting all of them (not only the window's) stays cheap."""
WINDOWED_EVENTS: tuple[str, ...] = (
    *COUNTED_EVENTS,
    EventType.SUCCEEDED,
    EventType.CANCELLED,
    EventType.SKIPPED,
    EventType.LEASE_LOST,
)

BUCKETS: tuple[float, ...] = (0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
"""Upper bounds (seconds) of the duration, start-lag and claim-latency histograms."""

TIMINGS: dict[str, tuple[str, str]] = {
    # name: (end field, start field), of runs that ended succeeded or dead in the window
    "run_duration_seconds": ("finished_at", "started_at"),
    "run_start_lag_seconds": ("started_at", "scheduled_for"),
    "run_claim_latency_seconds": ("started_at", "available_at"),
}


@dataclass(frozen=True, kw_only=True)
class Timing:
    """A distribution over the window: cumulative bucket counts, count and sum."""

    buckets: tuple[int, ...]
    count: int
    total_seconds: float


@dataclass(frozen=True, kw_only=True)
class WorkerBeat:
    worker_id: str
    status: str
    heartbeat_at: datetime
    clock_skew_seconds: float | None


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """Everything one scrape reports, read at one instant ``now``."""

    now: datetime
    runs: RunCounts  # (state, queue, origin) -> count
    oldest_waiting: dict[str, datetime]  # queue -> oldest available_at of a due pending/retrying run
    events: dict[str, int]  # event type -> count of all time (COUNTED_EVENTS only)
    recent_events: dict[str, int]  # event type -> count in the last WINDOW (WINDOWED_EVENTS)
    timings: dict[str, dict[str, Timing]]  # metric name -> queue -> timing
    workers: dict[str, int]  # liveness (alive, stale, stopped) -> count
    live_workers: list[WorkerBeat]  # the workers not stopped
    schedules_total: int
    schedules_paused: int
    schedules_overdue: int
    oldest_overdue: datetime | None
    queues: list[str] = field(default_factory=list)
    paused_queues: list[str] = field(default_factory=list)  # never folded: operators make them, one by one
    runs_without_capable_worker: int = 0  # waiting runs whose task's capabilities no live worker has
    runs_with_unknown_task: int = 0  # waiting runs whose task no live worker has registered


def _event_counts(now: datetime) -> tuple[dict[str, int], dict[str, int]]:
    """Events by type: every rare one (``COUNTED_EVENTS``, all time) and each type's of the last hour."""
    # Ranges of the (event_type, created_at) index only: every rare event, and the
    # last hour of the frequent ones (one statement, two index ranges: an OR of
    # the two made the planners read far more of the index). Counting created_at needs no event row.
    since = now - WINDOW
    rare = (
        RunEvent.objects.filter(event_type__in=list(COUNTED_EVENTS))
        .order_by()
        .values("event_type")
        .annotate(n=Count("created_at"), recent=Count("created_at", filter=Q(created_at__gte=since)))
    )
    frequent = (
        RunEvent.objects.filter(
            event_type__in=[e for e in WINDOWED_EVENTS if e not in COUNTED_EVENTS], created_at__gte=since
        )
        .order_by()
        .values("event_type")
        .annotate(n=Count("created_at"), recent=Count("created_at"))
    )
    events: dict[str, int] = {}
    recent_events: dict[str, int] = {}
    for row in rare.union(frequent, all=True).order_by():  # no Meta.ordering on a union of groups
        events[row["event_type"]] = row["n"]
        recent_events[row["event_type"]] = row["recent"]
    return events, recent_events


EVENTS_FIGURE = "metrics:events"
TIMINGS_FIGURE = "metrics:timings"


def read_snapshot(now: datetime) -> Snapshot:
    """Ten small queries (two more with TASK_REQUIRES), each read from an index (the events table
    only through ``(event_type, created_at)``)."""
    # From the (state, queue, origin) index alone: no runs table row is read (see run_counts for exactness).
    stored = figures.memo_many(
        now, {BIG_TERMINAL_FIGURE: _big_terminal_counts, EVENTS_FIGURE: _event_counts, TIMINGS_FIGURE: _timings}
    )
    runs = _active_and_dead_counts() | stored[BIG_TERMINAL_FIGURE]
    # The claim query's partial index (queue, available_at) over waiting runs only.
    oldest_waiting = {
        row["queue"]: row["oldest"]
        for row in Run.objects.waiting(now).order_by().values("queue").annotate(oldest=Min("available_at"))
    }
    events, recent_events = stored[EVENTS_FIGURE]
    beats = list(
        Worker.objects.not_stopped()
        .order_by("worker_id")
        .values_list("worker_id", "status", "heartbeat_at", "clock_skew_seconds", "queues", "tasks")
    )
    live_workers = [
        WorkerBeat(worker_id=w, status=s, heartbeat_at=h, clock_skew_seconds=k) for w, s, h, k, _, _ in beats
    ]
    # (queues, tasks) of the alive ones: what runs_with_unknown_task needs, without reading them again.
    alive = [(q, t) for _, s, h, _, q, t in beats if Worker(status=s, heartbeat_at=h).liveness(now) == Liveness.ALIVE]
    workers = Worker.objects.liveness_counts(now)
    schedules = Schedule.objects.aggregate(total=Count("*"), paused=Count("pk", filter=Q(paused=True)))
    overdue = Schedule.objects.overdue(now, conf.MISFIRE_GRACE_SECONDS).aggregate(
        n=Count("*"), oldest=Min("next_run_at")
    )
    queues = sorted({queue for _, queue, _ in runs} | {"default"})
    snapshot = Snapshot(
        now=now,
        runs=runs,
        oldest_waiting=oldest_waiting,
        events=events,
        recent_events=recent_events,
        timings=stored[TIMINGS_FIGURE],
        workers=workers,
        live_workers=live_workers,
        schedules_total=schedules["total"],
        schedules_paused=schedules["paused"],
        schedules_overdue=overdue["n"],
        oldest_overdue=overdue["oldest"],
        queues=queues,
        paused_queues=list(QueuePause.objects.order_by("queue").values_list("queue", flat=True)),
        # No query while TASK_REQUIRES is empty.
        runs_without_capable_worker=capability_service.runs_without_capable_worker(now),
        runs_with_unknown_task=_runs_with_unknown_task(now, alive),
    )
    return queue_labels.bounded(snapshot)  # at most METRICS_MAX_QUEUES queues labelled one by one


UNKNOWN_TASK_CACHE_KEY = "distsched:stats:runs_with_unknown_task"
UNKNOWN_TASK_CACHE_SECONDS = 30
UNKNOWN_TASK_SLOW_SECONDS = 0.1


def _runs_with_unknown_task(now: datetime, alive: unknown_tasks.LiveWorkers) -> int:
    """No query while a live worker has not published its tasks. The count reads every waiting
    run (no index holds task names by state): about 0.4 s for 200,000 on SQLite, so a count that
    took longer than UNKNOWN_TASK_SLOW_SECONDS is kept in the Django cache for
    UNKNOWN_TASK_CACHE_SECONDS (a small backlog is always counted afresh)."""
    cached = cache.get(UNKNOWN_TASK_CACHE_KEY)
    if cached is not None:
        return int(cached)
    started = time.monotonic()
    count = unknown_tasks.runs_with_unknown_task(now, live=alive)
    if time.monotonic() - started > UNKNOWN_TASK_SLOW_SECONDS:
        cache.set(UNKNOWN_TASK_CACHE_KEY, count, UNKNOWN_TASK_CACHE_SECONDS)
    return count


def _timings(now: datetime) -> dict[str, dict[str, Timing]]:
    """One grouped query over the newest ``SAMPLE`` runs of the window (``finished_at`` index, newest
    first): bucket counts as conditional COUNTs. Each run costs about 9 µs, so a million runs an
    hour would cost 9 s; the sample bounds it (the window's runs, or its newest ``SAMPLE``)."""
    newest = (
        Run.objects.filter(
            finished_at__gte=now - WINDOW, state__in=[RunState.SUCCEEDED, RunState.DEAD], started_at__isnull=False
        )
        .order_by("-finished_at")
        .values("pk")[:SAMPLE]
    )
    qs = Run.objects.filter(pk__in=newest).order_by()
    aggregates: dict[str, Any] = {}
    for name, (end, start) in TIMINGS.items():
        qs = qs.alias(**{name: Microseconds(F(end), F(start))})  # in the database, exact to the microsecond
        aggregates[f"{name}__sum"] = Sum(name)
        for i, bound in enumerate(BUCKETS):
            aggregates[f"{name}__le{i}"] = Count("pk", filter=Q(**{f"{name}__lte": round(bound * 1_000_000)}))
    aggregates["n"] = Count("*")
    out: dict[str, dict[str, Timing]] = {name: {} for name in TIMINGS}
    for row in qs.values("queue").annotate(**aggregates):
        for name in TIMINGS:
            total = row[f"{name}__sum"]
            out[name][row["queue"]] = Timing(
                buckets=tuple(row[f"{name}__le{i}"] for i in range(len(BUCKETS))),
                count=row["n"],
                total_seconds=total / 1_000_000 if total is not None else 0.0,
            )
    return out


figures.register(EVENTS_FIGURE, _event_counts)
figures.register(TIMINGS_FIGURE, _timings)
