"""The only writer of RunEvent: the append-only history of every run."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from ..db import bulk
from ..models import Run, RunEvent
from ..text import storable

MAX_MESSAGE_CHARS = 2000


@dataclass(kw_only=True, slots=True)
class NewEvent:
    """An event to append (``record_many``). Not frozen: a frozen dataclass sets each field
    through ``object.__setattr__``, twice the cost of building one, and the worker builds a
    couple per run."""

    run_id: int
    event_type: str
    now: datetime
    message: str = ""
    worker_id: str = ""
    attempt: int = 0
    data: dict | None = None  # a failed attempt's exception (see RunEvent.data)


def _storable(message: str) -> str:
    """Task errors and operator names may carry anything: bounded and storable."""
    return storable(message, MAX_MESSAGE_CHARS)


def _build(e: NewEvent) -> RunEvent:
    return RunEvent(
        run_id=e.run_id,
        event_type=e.event_type,
        message=_storable(e.message),
        worker_id=e.worker_id,
        attempt=e.attempt,
        created_at=e.now,
        data=e.data,
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
        NewEvent(run_id=run_id, event_type=event_type, now=now, message=message, worker_id=worker_id, attempt=attempt)
    )
    event.save(force_insert=True)
    return event


def record_many(events: Iterable[NewEvent], *, along: Sequence[bulk.Statement] = (), last: bool = False) -> None:
    """Append several events at once (tick and batch outcomes).

    Written as one bulk insert (``db.bulk``) rather than ``bulk_create`` because
    it sits on the worker's hot path: building model instances cost more than
    the insert itself. ``along``: statements written with it (a claim's UPDATE of its runs
    and its limit holds: one round trip on PostgreSQL, ``bulk.insert_rows``). ``last``: the
    caller's last statement in its transaction (``bulk.execute``: on PostgreSQL it may carry
    the COMMIT).
    """
    events = list(events)
    rows = columns(events)
    if rows is None:
        # A failure's exception details (JSON): rare, so the ORM writes them in one INSERT.
        bulk.run_all(along)
        RunEvent.objects.bulk_create([_build(e) for e in events])
        return
    bulk.insert_rows(RunEvent, rows, along=along, last=last)


def columns(events: Sequence[NewEvent]) -> bulk.Columns | None:
    """The events as ``db.bulk`` columns of ``RunEvent`` (its plain insert), or None when one
    carries exception details (``data``), which the ORM writes."""
    if any(e.data is not None for e in events):
        return None
    return {
        "run": [e.run_id for e in events],
        "event_type": [e.event_type for e in events],
        "message": [_storable(e.message) if e.message else "" for e in events],
        "worker_id": [e.worker_id for e in events],
        "attempt": [e.attempt for e in events],
        "created_at": [e.now for e in events],
    }


def history(run_id: int) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run_id=run_id).order_by("id"))
