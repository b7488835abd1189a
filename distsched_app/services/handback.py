"""Giving leased runs back unused: the one write a worker stopping with prefetched runs
(``outcomes.release_runs``) and a worker that lacks a run's task (``unknown_tasks.release_unknown``)
share. The attempt is handed back too, so the next claim issues the same fencing token."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from django.db.models import F

from ..db import notify
from ..models import Run, RunState
from . import limits


def hand_back(
    ids: list[int],
    *,
    worker_id: str,
    states: Collection[str],
    available_at: datetime,
    now: datetime,
    attempt: int | None = None,
    unstarted: bool = False,
) -> None:
    """In the caller's transaction (the runs already fenced and locked by it): the runs among ``ids``
    still leased by ``worker_id`` in ``states`` (and at ``attempt``, when given) go back to
    ``pending`` from ``available_at``, lease cleared, attempt handed back, ``started_at`` cleared
    with ``unstarted``; their limit slots are freed, and workers are woken when claimable at once."""
    fence = {"attempts": attempt} if attempt is not None else {}
    Run.objects.filter(pk__in=ids, lease_owner=worker_id, state__in=list(states), **fence).update(
        state=RunState.PENDING,
        lease_owner="",
        lease_expires_at=None,
        available_at=available_at,
        attempts=F("attempts") - 1,
        **({"started_at": None} if unstarted else {}),
        updated_at=now,
    )
    limits.release(ids, now=now, replaced=ids)
    if available_at <= now:
        notify.notify(Run.objects.filter(pk__in=ids).values_list("queue", flat=True))
