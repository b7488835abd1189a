"""The queues that ``/metrics`` labels one by one: a bounded set, whoever names queues.

Anyone allowed to enqueue may name a queue, and every queue costs /metrics a
few dozen series (3,000 names made a 12 MB scrape of 78,000 series). So while
the queues holding runs are at most ``DISTSCHED["METRICS_MAX_QUEUES"]`` (50),
each gets its own series, as before; past that, only the queues an operator
made known keep theirs: ``default``, ``DISTSCHED["QUEUES"]``, the schedules'
queues and those a running worker serves (at most ``METRICS_MAX_QUEUES`` of
them: ``default`` and the first others in name order), and every other queue is summed into one series labelled
``(other)``, a name no queue can have. Totals stay exact; the scrape stays small.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING

from ..conf import conf
from ..models import Schedule, Worker

if TYPE_CHECKING:
    from .stats import RunCounts, Snapshot, Timing

OTHER = "(other)"


def known_queues() -> set[str]:
    """The queues an operator made known (two small queries; read only past the cap)."""
    known = {"default", *(conf.QUEUES or ())}
    known.update(Schedule.objects.order_by().values_list("queue", flat=True).distinct())
    for queues in Worker.objects.not_stopped().values_list("queues", flat=True):
        known.update(q for q in queues or () if isinstance(q, str))
    return known


def bounded(snapshot: Snapshot) -> Snapshot:
    """``snapshot`` with at most ``METRICS_MAX_QUEUES`` queues labelled (plus ``(other)``)."""
    cap = conf.METRICS_MAX_QUEUES
    if len(snapshot.queues) <= cap:
        return snapshot
    labelled = {"default", *sorted(known_queues() & set(snapshot.queues) - {"default"})[: cap - 1]}

    def label(queue: str) -> str:
        return queue if queue in labelled else OTHER

    return replace(
        snapshot,
        runs=_fold_counts(snapshot.runs, label),
        oldest_waiting=_fold_oldest(snapshot.oldest_waiting.items(), label),
        timings={name: _fold_timings(by_queue, label) for name, by_queue in snapshot.timings.items()},
        queues=[*sorted(labelled), OTHER],
    )


def _fold_counts(counts: RunCounts, label: Callable[[str], str]) -> RunCounts:
    out: RunCounts = {}
    for (state, queue, origin), n in counts.items():
        key = (state, label(queue), origin)
        out[key] = out.get(key, 0) + n
    return out


def _fold_oldest(items: Iterable[tuple[str, datetime]], label: Callable[[str], str]) -> dict[str, datetime]:
    out: dict[str, datetime] = {}
    for queue, oldest in items:
        key = label(queue)
        out[key] = min(oldest, out.get(key, oldest))
    return out


def _fold_timings(by_queue: dict[str, Timing], label: Callable[[str], str]) -> dict[str, Timing]:
    out: dict[str, Timing] = {}
    for queue, t in by_queue.items():
        key = label(queue)
        seen = out.get(key)
        out[key] = (
            t
            if seen is None
            else replace(
                t,
                buckets=tuple(a + b for a, b in zip(seen.buckets, t.buckets, strict=True)),
                count=seen.count + t.count,
                total_seconds=seen.total_seconds + t.total_seconds,
            )
        )
    return out
