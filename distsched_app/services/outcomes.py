"""Fenced outcomes: what a worker may record about a run it holds.

Every update is conditional on ``lease_owner = me AND attempts = my attempt``
(the fencing token). A worker whose lease expired and was taken over changes
nothing: its late result is discarded and ``lease_lost`` is recorded, so a
zombie can never overwrite the outcome of the attempt that replaced it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection, transaction

from ..backoff import retry_delay
from ..conf import conf
from ..models import LEASED_STATES, EventType, Run, RunState
from . import events


@dataclass(frozen=True, kw_only=True)
class LeaseStatus:
    held: bool
    cancel_requested: bool = False


def truncate_error(text: str, limit: int | None = None) -> str:
    """Keep stored errors bounded: the head and the tail (where the raise is)."""
    limit = limit or conf.MAX_ERROR_CHARS
    if len(text) <= limit:
        return text
    half = (limit - 40) // 2
    return f"{text[:half]}\n... [{len(text) - 2 * half} characters truncated] ...\n{text[-half:]}"


def _fenced(run_id: int, worker_id: str, attempt: int):
    return Run.objects.filter(pk=run_id, lease_owner=worker_id, attempts=attempt, state__in=LEASED_STATES)


def record_success(
    *, run_id: int, worker_id: str, attempt: int, now: datetime, result: object = None, note: str = ""
) -> bool:
    """Mark the run succeeded. False (and a ``lease_lost`` event) if we no longer hold it."""
    with transaction.atomic():
        updated = _fenced(run_id, worker_id, attempt).update(
            state=RunState.SUCCEEDED, finished_at=now, lease_owner="", lease_expires_at=None,
            result=result, updated_at=now,
        )
        if updated:
            events.record(run_id, EventType.SUCCEEDED, now=now, worker_id=worker_id, attempt=attempt,
                          message=note)
            return True
        _lease_lost(run_id, worker_id, attempt, now, "succeeded")
        return False


def record_failure(
    *,
    run_id: int,
    worker_id: str,
    attempt: int,
    now: datetime,
    error: str,
    traceback_text: str = "",
    cancelled: bool = False,
    rand: Callable[[], float] = random.random,
) -> str | None:
    """Record a failed attempt: retrying with backoff, dead, or cancelled.

    ``cancelled`` means the task raised RunCancelled. A failure after a cancel
    request also ends ``cancelled``, never ``retrying``. Returns the new state,
    or None when the lease was lost.
    """
    with transaction.atomic():
        qs = _fenced(run_id, worker_id, attempt).select_related("schedule")
        if connection.features.has_select_for_update:
            qs = qs.select_for_update(of=("self",))
        run = qs.first()
        if run is None:
            _lease_lost(run_id, worker_id, attempt, now, "failed")
            return None
        full_error = truncate_error(f"{error}\n\n{traceback_text}".strip())
        changes: dict[str, object] = {
            "last_error": full_error, "lease_owner": "", "lease_expires_at": None, "updated_at": now,
        }
        new: list[events.NewEvent] = []
        if cancelled or run.cancel_requested:
            changes.update(state=RunState.CANCELLED, finished_at=now)
            if not cancelled:
                new.append(events.NewEvent(run_id=run_id, event_type=EventType.FAILED, now=now,
                                           worker_id=worker_id, attempt=attempt, message=error))
            new.append(events.NewEvent(run_id=run_id, event_type=EventType.CANCELLED, now=now,
                                       worker_id=worker_id, attempt=attempt,
                                       message=error if cancelled else "cancel requested"))
        else:
            new.append(events.NewEvent(run_id=run_id, event_type=EventType.FAILED, now=now,
                                       worker_id=worker_id, attempt=attempt, message=error))
            if run.attempts < run.max_attempts:
                schedule = run.schedule
                delay = retry_delay(run.attempts, base=schedule.retry_base_seconds,
                                    cap=schedule.retry_max_seconds, jitter=schedule.retry_jitter, rand=rand)
                available = now + timedelta(seconds=delay)
                changes.update(state=RunState.RETRYING, available_at=available)
                new.append(events.NewEvent(
                    run_id=run_id, event_type=EventType.RETRY_SCHEDULED, now=now, worker_id=worker_id,
                    attempt=attempt,
                    message=f"attempt {run.attempts}/{run.max_attempts} failed; retry in {delay:.1f}s "
                            f"at {available.isoformat()}",
                ))
            else:
                changes.update(state=RunState.DEAD, finished_at=now)
                new.append(events.NewEvent(
                    run_id=run_id, event_type=EventType.MARKED_DEAD, now=now, worker_id=worker_id,
                    attempt=attempt, message=f"no attempts left ({run.attempts}/{run.max_attempts})",
                ))
        _fenced(run_id, worker_id, attempt).update(**changes)
        events.record_many(new)
        return str(changes["state"])


def renew_lease(
    *, run_id: int, worker_id: str, attempt: int, now: datetime, lease_seconds: float
) -> LeaseStatus:
    """Extend the lease of a run we hold; also reports a pending cancel request."""
    expires = now + timedelta(seconds=lease_seconds)
    with transaction.atomic():
        held = _fenced(run_id, worker_id, attempt).update(lease_expires_at=expires, updated_at=now)
    if not held:
        return LeaseStatus(held=False)
    cancel = Run.objects.filter(pk=run_id).values_list("cancel_requested", flat=True).first()
    return LeaseStatus(held=True, cancel_requested=bool(cancel))


def _lease_lost(run_id: int, worker_id: str, attempt: int, now: datetime, outcome: str) -> None:
    if Run.objects.filter(pk=run_id).exists():
        events.record(
            run_id, EventType.LEASE_LOST, now=now, worker_id=worker_id, attempt=attempt,
            message=f"attempt {attempt} by {worker_id} no longer holds the lease; outcome {outcome!r} discarded",
        )
