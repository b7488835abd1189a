"""Prometheus metrics at ``GET /metrics``, computed from the database at scrape time.

Nothing is counted in process memory: each scrape builds a fresh registry
whose collector reads one snapshot (``services.stats.read_snapshot``,
ten indexed aggregate queries whatever the data; the three whose cost grows with history or
throughput are stored figures, ``services.figures``: computed by the leader every 15 s and read
by the scrape, at most 30 s old) and, when limits are declared,
their status (``services.limit_summary``: a few queries per limit), so every web process
answers the same numbers however many workers, tickers and web processes
run. This module only names and renders the metric families, and serves the view.

The ``*_total`` counters are derived from durable state (succeeded runs, run
events of a type); pruning history lowers them, which Prometheus' ``rate()``
treats as a counter reset. A stored figure only delays them (never lowers them
out of turn): between two computations they hold their value. The timing
histograms are gauge histograms over the last hour's finished runs, its newest
20,000 when more (``stats.SAMPLE``): their ``_gcount`` is the runs described, not the hour's
throughput (``distsched_run_events_last_hour`` counts that). For alerts, ``distsched_run_events_last_hour`` is a
window that no prune or requeue disturbs.

Access: a token or session user with the ``distsched_app.view_metrics``
permission, unless ``DISTSCHED["METRICS_PUBLIC"]`` is true.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

from django.http import HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeHistogramMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from rest_framework.authentication import SessionAuthentication, TokenAuthentication
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.parsers import BaseParser
from rest_framework.renderers import BaseRenderer
from rest_framework.views import APIView

from .api.permissions import METRICS, ModelPermissions
from .clock import Clock, current_clock
from .conf import conf
from .models import EventType, Liveness, Origin, RunState
from .services import leader, limit_summary, workflow_ops
from .services.limit_overrides import LimitStatus
from .services.stats import (
    BUCKETS,
    COUNTED_EVENTS,
    TIMINGS,
    WINDOWED_EVENTS,
    Snapshot,
    read_snapshot,
    runs_by_state_and_queue,
)

COUNTERS: dict[str, tuple[str, str]] = {
    # event type (stats.COUNTED_EVENTS): (counter name, help)
    EventType.MARKED_DEAD: (
        "distsched_runs_dead",
        "Runs that went dead, out of attempts (marked_dead events; a run requeued and dead again counts twice).",
    ),
    EventType.FAILED: ("distsched_run_failures", "Failed attempts (failed events)."),
    EventType.RETRY_SCHEDULED: (
        "distsched_run_retries",
        "Retries scheduled after a failed attempt (retry_scheduled events).",
    ),
    EventType.LEASE_EXPIRED: (
        "distsched_leases_expired",
        "Leases that expired because their worker went silent (lease_expired events).",
    ),
}

TIMING_HELP: dict[str, str] = {
    # stats.TIMINGS name: help
    "run_duration_seconds": "Run duration (finished_at - started_at of the last attempt) of runs that ended "
    "succeeded or dead in the last hour (its newest 20,000 when more; a gauge histogram of them).",
    "run_start_lag_seconds": "Start lag (started_at - scheduled_for: how late the last attempt started "
    "after its slot, retry backoff included) of runs finished in the last hour (its newest 20,000 when more).",
    "run_claim_latency_seconds": "Claim latency (started_at - available_at: how long the last attempt waited "
    "for a worker once eligible) of runs finished in the last hour (its newest 20,000 when more).",
}


class DistschedCollector(Collector):
    """A prometheus-client collector over the database; reads the clock once per collect.

    Register it in any registry (``REGISTRY.register(DistschedCollector())``)
    to serve distsched's metrics from an existing exporter.
    """

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or current_clock()

    def describe(self) -> list[Metric]:
        return []  # no query at registration time

    def collect(self) -> Iterator[Metric]:
        now = self.clock.now()
        yield from families(read_snapshot(now))
        yield from limit_families(limit_summary.statuses(now))  # no query when no limit is declared
        yield workflow_family(workflow_ops.workflows_by_state())
        yield from leader_families(leader.status())


def leader_families(s: leader.LeaderStatus) -> Iterator[Metric]:
    """Whether a ticker leads and under which term: no holder label (holders change at every
    restart); a term that climbs fast means leadership churns."""
    yield GaugeMetricFamily(
        "distsched_leader_present",
        "1 while a ticker holds a live leader lease (it ticks and runs the chores), else 0.",
        value=1 if s.holder is not None else 0,
    )
    yield GaugeMetricFamily(
        "distsched_leader_term",
        "The leader's term: grows by one at each change of leader (0: never elected).",
        value=s.term,
    )


def families(s: Snapshot) -> Iterator[Metric]:
    """The metric families of one snapshot (pure: no database, no clock)."""
    runs = GaugeMetricFamily(
        "distsched_runs",
        "Runs by current state, queue and origin (schedule, manual, enqueued; exact; succeeded/cancelled/skipped "
        "may be up to 30 s old once counting them takes 50 ms: a stored figure).",
        labels=["state", "queue", "origin"],
    )
    # Every origin with a zero where it has no runs (stable series); one stored by hand too, so the
    # origins of a state and queue always add up to its runs.
    origins = [*Origin.values, *sorted({o for _, _, o in s.runs} - set(Origin.values))]
    for queue in s.queues:
        for state in RunState.values:
            for origin in origins:
                runs.add_metric([state, queue, origin], s.runs.get((state, queue, origin), 0))
    yield runs
    by_queue = runs_by_state_and_queue(s.runs)
    succeeded = CounterMetricFamily(
        "distsched_runs_succeeded",
        "Runs that succeeded (runs in state succeeded; like distsched_runs, up to 30 s old on a large history).",
        labels=["queue"],
    )
    for queue in s.queues:
        succeeded.add_metric([queue], by_queue.get((RunState.SUCCEEDED, queue), 0))
    yield succeeded
    for event_type in COUNTED_EVENTS:
        name, text = COUNTERS[event_type]
        yield CounterMetricFamily(name, text, value=s.events.get(event_type, 0))
    recent = GaugeMetricFamily(
        "distsched_run_events_last_hour",
        "Run events of each type recorded in the last hour (unaffected by prune and requeue: use it for alerts; "
        "up to 30 s old once counting them takes 50 ms).",
        labels=["event_type"],
    )
    for event_type in WINDOWED_EVENTS:
        recent.add_metric([str(event_type)], s.recent_events.get(event_type, 0))
    yield recent
    waiting = GaugeMetricFamily(
        "distsched_oldest_waiting_run_age_seconds",
        "Seconds the oldest due pending/retrying run has been waiting for a worker (0: none waiting).",
        labels=["queue"],
    )
    for queue in s.queues:
        oldest = s.oldest_waiting.get(queue)
        waiting.add_metric([queue], _age(s.now, oldest))
    yield waiting

    for name in TIMINGS:
        histogram = GaugeHistogramMetricFamily(f"distsched_{name}", TIMING_HELP[name], labels=["queue"])
        for queue, t in sorted(s.timings[name].items()):
            buckets = [(_bound(b), n) for b, n in zip(BUCKETS, t.buckets, strict=True)] + [("+Inf", t.count)]
            histogram.add_metric([queue], buckets, gsum_value=t.total_seconds)
        yield histogram

    workers = GaugeMetricFamily(
        "distsched_workers",
        "Workers by liveness: alive (heartbeat fresh), stale "
        "(not stopped, heartbeat older than STALE_AFTER_SECONDS), stopped.",
        labels=["state"],
    )
    for liveness in Liveness.values:
        workers.add_metric([liveness], s.workers[liveness])
    yield workers
    age = GaugeMetricFamily(
        "distsched_worker_heartbeat_age_seconds",
        "Seconds since each non-stopped worker's last heartbeat.",
        labels=["worker_id", "status"],
    )
    skew = GaugeMetricFamily(
        "distsched_worker_clock_skew_seconds",
        "How far each worker's clock is ahead of the database's (PostgreSQL only).",
        labels=["worker_id"],
    )
    for w in s.live_workers:
        age.add_metric([w.worker_id, w.status], _age(s.now, w.heartbeat_at))
        if w.clock_skew_seconds is not None:
            skew.add_metric([w.worker_id], w.clock_skew_seconds)
    yield age
    yield skew

    schedules = GaugeMetricFamily("distsched_schedules", "Schedules by state.", labels=["state"])
    schedules.add_metric(["active"], s.schedules_total - s.schedules_paused)
    schedules.add_metric(["paused"], s.schedules_paused)
    yield schedules
    yield GaugeMetricFamily(
        "distsched_schedules_overdue",
        "Active schedules whose next_run_at is older than MISFIRE_GRACE_SECONDS: no ticker is running.",
        value=s.schedules_overdue,
    )
    yield GaugeMetricFamily(
        "distsched_schedule_max_overdue_seconds",
        "Seconds the most overdue active schedule's next_run_at is in the past (0: none overdue).",
        value=_age(s.now, s.oldest_overdue),
    )
    paused = GaugeMetricFamily(
        "distsched_queue_paused",
        "1 for each paused queue (its runs are not claimed until it is resumed); paused queues only.",
        labels=["queue"],
    )
    for queue in s.paused_queues:
        paused.add_metric([queue], 1)
    yield paused
    yield GaugeMetricFamily(
        "distsched_runs_without_capable_worker",
        "Waiting runs whose task requires capabilities (TASK_REQUIRES) that no live worker serving their queue "
        "has all of: nothing can claim them until such a worker starts.",
        value=s.runs_without_capable_worker,
    )
    yield GaugeMetricFamily(
        "distsched_runs_with_unknown_task",
        "Waiting runs whose task no live worker serving their queue has registered (a rolling deploy's new "
        "task before a new worker is up, or a task removed from the code); 0 while a live worker has not "
        "published its tasks. A count that took over 0.1 s is reused for 30 s.",
        value=s.runs_with_unknown_task,
    )


LIMIT_GAUGES: list[tuple[str, str, Callable[[LimitStatus], float | None]]] = [
    # (name, help, value of one limit; None: no series for it)
    (
        "distsched_limit_capacity",
        "Each declared limit's effective cap: its total when it has one, else its concurrency (per partition, "
        "under any override; a paused limit keeps its number); no series for a limit with only a rate.",
        limit_summary.capacity,
    ),
    (
        "distsched_limit_in_use",
        "Runs holding a slot of each limit (leased or running, live lease).",
        lambda s: s.in_use,
    ),
    ("distsched_limit_blocked_runs", "Runs blocked waiting for a slot of each limit.", lambda s: s.blocked),
    (
        "distsched_limit_throttled_runs",
        "Waiting runs whose start a rate of each limit moved later.",
        lambda s: s.throttled,
    ),
    (
        "distsched_limit_partitions_saturated",
        "Partitions of each limit whose runs in use reach their concurrency.",
        lambda s: s.saturated_partitions,
    ),
    (
        "distsched_limit_overridden",
        "1 while an operator's override of the limit is in force, else 0.",
        lambda s: 1 if s.override is not None else 0,
    ),
]


def limit_families(statuses: Sequence[LimitStatus]) -> Iterator[Metric]:
    """One series per declared limit and gauge (no partition label: partitions may be many). Every
    family is served, empty without limits, so its name and help are always there."""
    for name, text, value_of in LIMIT_GAUGES:
        family = GaugeMetricFamily(name, text, labels=["limit"])
        for status in statuses:
            value = value_of(status)
            if value is not None:
                family.add_metric([status.name], value)
        yield family


def workflow_family(by_state: dict[str, int]) -> Metric:
    """``distsched_workflows{state}``: workflows by state, every state a series (0 when none)."""
    family = GaugeMetricFamily("distsched_workflows", "Workflows by state.", labels=["state"])
    for state, count in by_state.items():
        family.add_metric([state], count)
    return family


def _age(now: datetime, then: datetime | None) -> float:
    return max(0.0, (now - then).total_seconds()) if then is not None else 0.0


def _bound(seconds: float) -> str:
    return repr(float(seconds))


# ------------------------------------------------------------------ the view


class PrometheusTextRenderer(BaseRenderer):
    """Renders DRF's error responses (401/403/405) as one plain-text line."""

    media_type = "text/plain"
    format = "txt"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        if isinstance(data, dict) and "detail" in data:
            data = data["detail"]
        return f"{data}\n".encode()


class PlainTextNegotiation(BaseContentNegotiation):
    """Whatever the scraper's Accept header says, the answer is Prometheus text (never a 406)."""

    def select_parser(self, request: Any, parsers: Iterable[BaseParser]) -> BaseParser | None:
        return next(iter(parsers), None)

    def select_renderer(
        self, request: Any, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        renderer = next(iter(renderers))
        return renderer, renderer.media_type


class MetricsView(APIView):
    """``GET /metrics``: needs ``distsched_app.view_metrics``, unless ``METRICS_PUBLIC``.

    Authentication is set here, as on the API's views, so the host project's
    ``REST_FRAMEWORK`` defaults play no part: token first, so an anonymous
    scraper gets 401 with ``WWW-Authenticate: Token``.
    """

    authentication_classes = [TokenAuthentication, SessionAuthentication]
    permission_classes = [ModelPermissions]
    required_permissions = {"get": METRICS}
    renderer_classes = [PrometheusTextRenderer]
    content_negotiation_class = PlainTextNegotiation
    http_method_names = ["get", "head"]
    schema = None  # not part of the REST API's OpenAPI document

    def get_authenticators(self) -> list[Any]:
        # Public metrics skip authentication entirely, so a stale token or
        # session cookie on the scraper cannot turn a public endpoint into a 401.
        return [] if conf.METRICS_PUBLIC else list(super().get_authenticators())

    def get_permissions(self) -> Sequence[Any]:
        return [] if conf.METRICS_PUBLIC else super().get_permissions()

    def get(self, request: Any) -> HttpResponse:
        registry = CollectorRegistry()
        registry.register(DistschedCollector(current_clock()))
        return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


metrics_view = MetricsView.as_view()
