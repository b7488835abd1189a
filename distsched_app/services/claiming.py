"""Claiming: a worker takes ownership of due runs under an expiring lease.

One transaction per claim. PostgreSQL locks candidate rows with
``FOR UPDATE SKIP LOCKED`` so concurrent workers never block on, or take, the
same run; SQLite's ``BEGIN IMMEDIATE`` serialises claimers on the write lock.
The UPDATE is additionally guarded on the state and attempt we read, so a
claim can never overwrite a concurrent change even without row locks.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import F

from ..models import EventType, Run, RunQuerySet, RunState
from . import events


def _lock(qs: RunQuerySet) -> RunQuerySet:
    qs = qs.select_related("schedule")
    if connection.features.has_select_for_update_skip_locked:
        qs = qs.select_for_update(skip_locked=True, of=("self",))
    return qs


def claim_runs(
    *,
    worker_id: str,
    queues: Sequence[str] | None,
    lease_seconds: float,
    now: datetime,
    limit: int = 1,
) -> list[Run]:
    """Claim up to ``limit`` runs: expired leases first, then due runs by time.

    Each claimed run is ``running``, owned by ``worker_id`` until
    ``now + lease_seconds``, with ``attempts`` incremented (the fencing token).
    A run whose lease expired with no attempts left is marked dead instead;
    one whose cancel was requested is cancelled instead of run again.
    """
    queues = list(queues) if queues else None
    expires = now + timedelta(seconds=lease_seconds)
    new_events: list[events.NewEvent] = []
    with transaction.atomic():
        candidates: list[Run] = []
        for run in _lock(Run.objects.lease_expired(now, queues))[:limit]:
            new_events.append(events.NewEvent(
                run_id=run.pk, event_type=EventType.LEASE_EXPIRED, now=now, worker_id=run.lease_owner,
                attempt=run.attempts,
                message=f"lease of {run.lease_owner} expired at {run.lease_expires_at.isoformat()}",
            ))
            if run.cancel_requested or run.attempts >= run.max_attempts:
                _finish_abandoned(run, now, new_events)
            else:
                candidates.append(run)
        if len(candidates) < limit:
            candidates.extend(_lock(Run.objects.waiting(now, queues))[: limit - len(candidates)])
        if candidates:
            Run.objects.filter(pk__in=[r.pk for r in candidates]).update(
                state=RunState.RUNNING,
                lease_owner=worker_id,
                lease_expires_at=expires,
                attempts=F("attempts") + 1,
                started_at=now,
                updated_at=now,
            )
        for run in candidates:
            run.state = RunState.RUNNING
            run.lease_owner = worker_id
            run.lease_expires_at = expires
            run.attempts += 1
            run.started_at = now
            run.updated_at = now
            for kind in (EventType.CLAIMED, EventType.STARTED):
                new_events.append(events.NewEvent(
                    run_id=run.pk, event_type=kind, now=now, worker_id=worker_id, attempt=run.attempts,
                ))
        events.record_many(new_events)
    return candidates


def claim_next_run(
    *, worker_id: str, queues: Sequence[str] | None, lease_seconds: float, now: datetime
) -> Run | None:
    """Claim the single oldest eligible run, or return None."""
    runs = claim_runs(worker_id=worker_id, queues=queues, lease_seconds=lease_seconds, now=now, limit=1)
    return runs[0] if runs else None


def _finish_abandoned(run: Run, now: datetime, new_events: list[events.NewEvent]) -> None:
    """An expired lease that must not run again: cancelled on request, else dead."""
    if run.cancel_requested:
        state, kind, message = RunState.CANCELLED, EventType.CANCELLED, "cancel requested; lease expired"
    else:
        state, kind = RunState.DEAD, EventType.MARKED_DEAD
        message = f"lease expired with no attempts left ({run.attempts}/{run.max_attempts})"
    Run.objects.filter(pk=run.pk, attempts=run.attempts, state=run.state).update(
        state=state, finished_at=now, lease_owner="", lease_expires_at=None, updated_at=now,
        last_error=run.last_error or message,
    )
    new_events.append(events.NewEvent(run_id=run.pk, event_type=kind, now=now, attempt=run.attempts,
                                      message=message))
