"""Per-queue and per-task figures for operators: the queues page, ``GET /api/queues``,
``distsched queue list`` and the dashboard's task timing all read them from here.

Read-only, and every query is bounded whatever the history holds:

- depth by state: the ``(state, queue, origin)`` index over unfinished runs only
  (``queues.list_queues``);
- the oldest waiting run per queue: the claim's partial index ``(queue, ...)``
  over pending/retrying runs;
- the last hour: runs that *finished* in ``WINDOW`` (the partial ``finished_at``
  index), at most ``SAMPLE_LIMIT`` of them, newest first. Start lag
  (``started_at - scheduled_for`` of the run's last attempt) and duration
  (``finished_at - started_at``) are computed by the database in whole
  microseconds (``db.expressions.Microseconds``); the percentiles are exact
  nearest-rank ones over that sample (p95 of 20 values is the 19th smallest);
- throughput: the window's finished runs per queue counted by the database
  (not capped), divided by its minutes;
- workers: the alive ones (a worker with no queue list serves every queue);
- limits: the declared ones that name the queue (``limit_rules``), and those that
  name a task whose runs sit in the queue.

Nothing reads the clock: every function takes ``now``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Count, F, Min

from ..db.expressions import Microseconds
from ..errors import NotFound
from ..models import ACTIVE_STATES, QueuePause, Run, RunState, Worker
from . import figures, limit_rules
from . import queues as queue_service
from .validation import QUEUE_RE, validate_queue

WINDOW = timedelta(hours=1)
SAMPLE_LIMIT = 20_000
"""At most this many of the window's finished runs feed the percentiles (the newest ones)."""
SLOWEST_TASKS = 10
TIMED_STATES = (RunState.SUCCEEDED, RunState.DEAD)
"""Runs that ran an attempt to its end: the ones with a duration (cancelled and skipped runs may never start)."""


@dataclass(frozen=True, kw_only=True)
class Percentiles:
    """Exact nearest-rank p50/p95 (seconds) of ``count`` values; None when there were none."""

    count: int
    p50: float | None
    p95: float | None
    max: float | None


@dataclass(frozen=True, kw_only=True)
class QueueStats:
    """One queue: what waits in it, how long runs wait before they start, how fast it drains."""

    queue: str
    runs: dict[str, int]  # every unfinished state a key (pending, retrying, blocked, leased, running)
    pause: QueuePause | None
    oldest_waiting_at: datetime | None  # available_at of its oldest due pending/retrying run
    oldest_waiting_seconds: float | None  # how long that run has waited, at ``now``
    start_lag: Percentiles  # runs finished in the window (succeeded or dead), their last attempt
    finished_last_hour: int  # every run that finished in the window (cancelled and skipped too)
    workers: list[str] = field(default_factory=list)  # alive workers serving it, by id
    limits: list[str] = field(default_factory=list)  # declared limits that apply to (some of) its runs

    @property
    def paused(self) -> bool:
        return self.pause is not None

    @property
    def depth(self) -> int:
        return sum(self.runs.values())

    @property
    def throughput_per_minute(self) -> float:
        return self.finished_last_hour / (WINDOW.total_seconds() / 60)


@dataclass(frozen=True, kw_only=True)
class TaskTiming:
    """One task over the window: runs that finished, how many of them dead, their durations."""

    task_name: str
    finished: int
    failures: int  # finished dead (out of attempts) in the window
    duration: Percentiles


def percentiles(values: Sequence[float]) -> Percentiles:
    """Nearest-rank: the p-th percentile is the value at rank ceil(p/100 * n) of the sorted values."""
    ordered = sorted(values)
    if not ordered:
        return Percentiles(count=0, p50=None, p95=None, max=None)

    def rank(p: int) -> float:
        return ordered[max(math.ceil(p * len(ordered) / 100), 1) - 1]

    return Percentiles(count=len(ordered), p50=rank(50), p95=rank(95), max=ordered[-1])


def _window_rows(now: datetime) -> list[tuple[str, str, str, int | None, int | None]]:
    """(queue, task, state, start lag µs, duration µs) of the window's newest finished runs."""
    qs = (
        Run.objects.filter(finished_at__gte=now - WINDOW, finished_at__lte=now)
        .order_by("-finished_at")
        .annotate(lag_us=Microseconds(F("started_at"), F("scheduled_for")))
        .annotate(run_us=Microseconds(F("finished_at"), F("started_at")))
        .values_list("queue", "task_name", "state", "lag_us", "run_us")
    )
    return list(qs[:SAMPLE_LIMIT])


def _finished_counts(now: datetime) -> dict[str, int]:
    rows = (
        Run.objects.filter(finished_at__gte=now - WINDOW, finished_at__lte=now)
        .order_by()
        .values("queue")
        .annotate(n=Count("*"))
    )
    return {row["queue"]: row["n"] for row in rows}


def _oldest_waiting(now: datetime) -> dict[str, datetime]:
    rows = Run.objects.waiting(now).order_by().values("queue").annotate(oldest=Min("available_at"))
    return {row["queue"]: row["oldest"] for row in rows}


def _alive_workers(now: datetime) -> list[tuple[str, list[str]]]:
    return [
        (w, list(q or ()))
        for w, q in Worker.objects.alive(now).order_by("worker_id").values_list("worker_id", "queues")
    ]


def _serving(workers: list[tuple[str, list[str]]], queue: str) -> list[str]:
    return [worker for worker, served in workers if not served or "*" in served or queue in served]


def _limits_for(queue: str, tasks: set[str]) -> list[str]:
    try:
        specs = limit_rules.declared().values()
    except Exception:  # noqa: BLE001 - a malformed LIMITS setting is the system check's to report
        return []
    return [spec.name for spec in specs if queue in spec.queues or spec.tasks & tasks]


@dataclass(frozen=True, kw_only=True)
class Window:
    """What the last hour's finished runs say, per queue and per task (one figure: ``services.figures``)."""

    start_lags: dict[str, Percentiles]  # queue -> start lag over the sample
    tasks: dict[str, set[str]]  # queue -> tasks of its runs in the sample
    finished: dict[str, int]  # queue -> runs finished in the window (counted, not sampled)
    task_timings: list[TaskTiming]  # every task of the sample, slowest first


def _window(now: datetime) -> Window:
    rows = _window_rows(now)
    lags: dict[str, list[float]] = {}
    tasks: dict[str, set[str]] = {}
    for queue, task, state, lag_us, _ in rows:
        tasks.setdefault(queue, set()).add(task)
        if state in TIMED_STATES and lag_us is not None:
            lags.setdefault(queue, []).append(lag_us / 1_000_000)
    return Window(
        start_lags={queue: percentiles(values) for queue, values in lags.items()},
        tasks=tasks,
        finished=_finished_counts(now),
        task_timings=_task_timings(rows),
    )


WINDOW_FIGURE = "queues:last-hour"
figures.register(WINDOW_FIGURE, _window)


def last_hour(now: datetime) -> Window:
    """The window's figures: a stored figure (at most 30 s old, ``services.figures``) once computing
    them takes 50 ms or more: the sample and the count read ~20,000 and every finished run of the hour."""
    return figures.memo(WINDOW_FIGURE, now, _window)


def queue_stats(*, now: datetime) -> list[QueueStats]:
    """Every queue with unfinished runs, a pause, a run finished in the last hour or a worker naming
    it, by name. Six bounded queries whatever the number of queues (two of them in ``last_hour``)."""
    summaries = {s.queue: s for s in queue_service.list_queues()}
    window = last_hour(now)
    finished = window.finished
    oldest = _oldest_waiting(now)
    workers = _alive_workers(now)
    named = {q for _, served in workers for q in served if q != "*" and QUEUE_RE.fullmatch(q)}
    names = sorted(summaries.keys() | finished.keys() | named)
    out = []
    for queue in names:
        summary = summaries.get(queue)
        waiting_since = oldest.get(queue)
        out.append(
            QueueStats(
                queue=queue,
                runs=dict(summary.runs) if summary else {s.value: 0 for s in ACTIVE_STATES},
                pause=summary.pause if summary else None,
                oldest_waiting_at=waiting_since,
                oldest_waiting_seconds=(now - waiting_since).total_seconds() if waiting_since else None,
                start_lag=window.start_lags.get(queue) or percentiles([]),
                finished_last_hour=finished.get(queue, 0),
                workers=_serving(workers, queue),
                limits=_limits_for(queue, window.tasks.get(queue, set())),
            )
        )
    return out


def queue_detail(name: object, *, now: datetime) -> QueueStats:
    """One queue's figures; ``NotFound`` when no run, pause or worker names it."""
    if not isinstance(name, str) or not QUEUE_RE.fullmatch(name):
        validate_queue(name)  # the typed error for a malformed name
    for found in queue_stats(now=now):
        if found.queue == name:
            return found
    raise NotFound(f"queue {name} has no unfinished run, no pause, no run finished in the last hour and no worker")


def task_timings(*, now: datetime, limit: int = SLOWEST_TASKS) -> list[TaskTiming]:
    """The window's tasks, slowest first (p95 duration, then name): how many runs finished, how
    many of them dead, and their p50/p95/max duration. From ``last_hour`` (one bounded query)."""
    return last_hour(now).task_timings[:limit]


def _task_timings(rows: list[tuple[str, str, str, int | None, int | None]]) -> list[TaskTiming]:
    durations: dict[str, list[float]] = {}
    finished: dict[str, int] = {}
    failures: dict[str, int] = {}
    for _, task, state, _, run_us in rows:
        if state not in TIMED_STATES:
            continue
        finished[task] = finished.get(task, 0) + 1
        failures[task] = failures.get(task, 0) + (state == RunState.DEAD)
        if run_us is not None:
            durations.setdefault(task, []).append(run_us / 1_000_000)
    timings = [
        TaskTiming(task_name=task, finished=n, failures=failures[task], duration=percentiles(durations.get(task, [])))
        for task, n in finished.items()
    ]
    timings.sort(key=lambda t: (-(t.duration.p95 or 0.0), t.task_name))
    return timings
