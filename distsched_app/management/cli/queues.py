"""The ``queue`` verbs of ``manage.py distsched``: pause, resume, list, history.

Like every verb (``verbs``), each reads its options and ``now``, calls
``services.queues`` and returns ``(the --json document, the text for humans)``.
The actor recorded is ``cli:<os user>``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from ...models import ACTIVE_STATES, QueueEvent, QueuePause
from ...services import queues
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


def queue_list(now: datetime, o: dict[str, Any]) -> Output:
    found = queues.list_queues()
    document = [
        {"queue": q.queue, "paused": q.paused, "runs": dict(q.runs), "pause": pause_record(q.pause)} for q in found
    ]
    rows = [
        (
            q.queue,
            *(q.runs[state.value] for state in ACTIVE_STATES),
            q.paused,
            q.pause.paused_by if q.pause else None,
            q.pause.paused_at if q.pause else None,
            q.pause.reason if q.pause else None,
        )
        for q in found
    ]
    headers = ("QUEUE", *(s.value.upper() for s in ACTIVE_STATES), "PAUSED", "PAUSED BY", "PAUSED AT", "REASON")
    return document, table(headers, rows) if found else "no queues with unfinished runs, none paused"


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
