"""The ``queue`` verbs of ``manage.py distsched``: pause, resume, list, history.

``queue list`` shows ``services.queue_stats``' figures (start lag and throughput over the last hour).

Like every verb (``verbs``), each reads its options and ``now``, calls
``services.queues`` and returns ``(the --json document, the text for humans)``.
The actor recorded is ``cli:<os user>``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from ...durations import human_duration
from ...models import ACTIVE_STATES, QueueEvent, QueuePause
from ...services import queue_stats, queues
from .records import iso
from .tables import table, when

Output = tuple[Any, str]


def pause_record(pause: QueuePause | None) -> dict[str, Any] | None:
    if pause is None:
        return None
    return {"paused_at": iso(pause.paused_at), "paused_by": pause.paused_by, "reason": pause.reason}


def event_record(event: QueueEvent) -> dict[str, Any]:
    return {
        "id": event.pk,
        "queue": event.queue,
        "action": event.action,
        "actor": event.actor,
        "reason": event.reason,
        "created_at": iso(event.created_at),
    }


def _pause_text(pause: QueuePause) -> str:
    why = f": {pause.reason!r}" if pause.reason else ""
    return f"by {pause.paused_by} at {when(pause.paused_at)}{why}"


def _change_record(change: queues.QueueChange, *, paused: bool) -> dict[str, Any]:
    pause = pause_record(change.pause)
    return {"queue": change.queue, "paused": paused, "changed": change.changed, "pause": pause}


def queue_pause(now: datetime, o: dict[str, Any]) -> Output:
    change = queues.pause_queue(o["name"], now=now, by=queues.cli_actor(), reason=o["reason"] or "")
    text = (
        f"queue {change.queue} was already paused {_pause_text(change.pause)}: nothing changed"
        if not change.changed and change.pause is not None
        else f"paused queue {change.queue}: its runs are not claimed until it is resumed"
    )
    return _change_record(change, paused=True), text


def queue_resume(now: datetime, o: dict[str, Any]) -> Output:
    change = queues.resume_queue(o["name"], now=now, by=queues.cli_actor())
    text = (
        f"resumed queue {change.queue} (paused {_pause_text(change.pause)})"
        if change.pause is not None
        else f"queue {change.queue} is not paused: nothing changed"
    )
    return _change_record(change, paused=False), text


def queue_record(q: queue_stats.QueueStats) -> dict[str, Any]:
    """One queue as ``--json`` gives it: the same keys as ``GET /api/queues``."""
    lag = q.start_lag
    return {
        "queue": q.queue,
        "paused": q.paused,
        "runs": dict(q.runs),
        "pause": pause_record(q.pause),
        "oldest_waiting_at": iso(q.oldest_waiting_at),
        "oldest_waiting_seconds": q.oldest_waiting_seconds,
        "start_lag": {"count": lag.count, "p50_seconds": lag.p50, "p95_seconds": lag.p95, "max_seconds": lag.max},
        "finished_last_hour": q.finished_last_hour,
        "throughput_per_minute": q.throughput_per_minute,
        "workers": list(q.workers),
        "limits": list(q.limits),
    }


def queue_list(now: datetime, o: dict[str, Any]) -> Output:
    found = queue_stats.queue_stats(now=now)
    rows = [
        (
            q.queue,
            *(q.runs[state.value] for state in ACTIVE_STATES),
            human_duration(q.oldest_waiting_seconds),
            human_duration(q.start_lag.p50),
            human_duration(q.start_lag.p95),
            f"{q.throughput_per_minute:.1f}",
            len(q.workers),
            ",".join(q.limits),
            _pause_text(q.pause) if q.pause else None,
        )
        for q in found
    ]
    headers = (
        "QUEUE",
        *(s.value.upper() for s in ACTIVE_STATES),
        "OLDEST WAIT",
        "LAG P50",
        "LAG P95",
        "PER MIN",
        "WORKERS",
        "LIMITS",
        "PAUSED",
    )
    text = table(headers, rows) if found else "no queues with unfinished runs, a pause, recent runs or a worker"
    return [queue_record(q) for q in found], text


def queue_history(now: datetime, o: dict[str, Any]) -> Output:
    found = queues.queue_events(o["name"], limit=o["limit"])
    rows = [(e.created_at, e.action, e.actor, e.reason) for e in found]
    text = table(("AT", "ACTION", "BY", "REASON"), rows, max_width=100) if found else f"queue {o['name']}: no history"
    return [event_record(e) for e in found], text


VERBS: dict[str, Callable[[datetime, dict[str, Any]], Output]] = {
    "queue pause": queue_pause,
    "queue resume": queue_resume,
    "queue list": queue_list,
    "queue history": queue_history,
}
