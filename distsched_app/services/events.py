"""The only writer of RunEvent: the append-only history of every run."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from ..models import Run, RunEvent

MAX_MESSAGE_CHARS = 2000


@dataclass(frozen=True, kw_only=True)
class NewEvent:
    run_id: int
    event_type: str
    now: datetime
    message: str = ""
    worker_id: str = ""
    attempt: int = 0


def _build(e: NewEvent) -> RunEvent:
    return RunEvent(
        run_id=e.run_id,
        event_type=e.event_type,
        message=e.message[:MAX_MESSAGE_CHARS],
        worker_id=e.worker_id,
        attempt=e.attempt,
        created_at=e.now,
    )


def record(
    run: Run | int,
    event_type: str,
    *,
    now: datetime,
    message: str = "",
    worker_id: str = "",
    attempt: int | None = None,
) -> RunEvent:
    """Append one event. Call inside the transaction that changed the run."""
    run_id = run if isinstance(run, int) else run.pk
    if attempt is None:
        attempt = 0 if isinstance(run, int) else run.attempts
    event = _build(
        NewEvent(run_id=run_id, event_type=event_type, now=now, message=message,
                 worker_id=worker_id, attempt=attempt)
    )
    event.save(force_insert=True)
    return event


def record_many(events: Iterable[NewEvent]) -> None:
    """Append several events in one statement (tick and batch outcomes)."""
    rows = [_build(e) for e in events]
    if rows:
        RunEvent.objects.bulk_create(rows, batch_size=500)


def history(run_id: int) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run_id=run_id).order_by("id"))
