"""``overlap="replace"``: a schedule's new slot replaces its earlier, unfinished runs.

In the tick's transaction (``services.tick``): the earlier active runs of the
schedule are locked (``earlier_runs``); the new slot's run is created ``blocked``
with ``held_by = "run:<id>"`` when one of them still executes (leased or running,
lease live at ``now``: ``waits_for``), else ``pending``; then each earlier run is
cancelled (``replace``): at once if it waits (pending, retrying, blocked), by a
cancel request if it executes, through ``services.runs.cancel_locked``, the one
cancel rule. Cancellation is cooperative: the old run ends when its task sees
``context.cancel_requested()`` (or when it finishes anyway, or its lease expires).

Then, in the transaction that takes the old run out of leased/running (success,
failure, cancel, dead, lease recovery, a prefetched run handed back), the
outcome hook calls ``release_replacements``: the runs blocked behind it become
``pending``. ``sweep_replacements`` is the safety net for a missed release and
for a lease that expired with nobody recovering it yet.

Lock order: the tick locks a schedule's runs in id order, and a releasing
transaction locks the old run before the blocked one (always a higher id), so
the two never wait on each other in a cycle.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import datetime

from django.db import transaction

from ..clock import iso_utc
from ..db import locks, notify
from ..models import ACTIVE_STATES, LEASED_STATES, EventType, Run, RunState
from . import events
from .runs import cancel_locked

HOLDER_PREFIX = "run:"
_EARLIER_FIELDS = ("id", "schedule_id", "state", "lease_expires_at", "cancel_requested", "attempts", "held_by")


def holder(run_id: int) -> str:
    """The ``held_by`` of a run blocked behind run ``run_id``."""
    return f"{HOLDER_PREFIX}{run_id}"


def holder_id(held_by: str) -> int | None:
    """The run id a ``held_by`` of this module names, else None (a limit's, or nothing)."""
    if not held_by.startswith(HOLDER_PREFIX):
        return None
    text = held_by[len(HOLDER_PREFIX) :]
    return int(text) if text.isdigit() else None


def executing(run: Run, now: datetime) -> bool:
    """Leased or running with a live lease: what a replacement waits for."""
    return run.state in LEASED_STATES and run.lease_expires_at is not None and run.lease_expires_at > now


def earlier_runs(schedule_ids: Collection[int]) -> dict[int, list[Run]]:
    """The active runs of these schedules, locked until COMMIT (``FOR UPDATE``, waiting for a
    worker that is recording one's outcome, so the tick decides on its final state), by schedule,
    oldest first."""
    if not schedule_ids:
        return {}
    qs = Run.objects.filter(schedule_id__in=list(schedule_ids), state__in=ACTIVE_STATES).order_by("id")
    out: dict[int, list[Run]] = {}
    for run in locks.row_locked(qs.only(*_EARLIER_FIELDS)):
        out.setdefault(run.schedule_id, []).append(run)
    return out


def waits_for(earlier: Iterable[Run], now: datetime) -> int | None:
    """The earlier run a new slot's run must wait for: the newest one still executing, or None."""
    live = [run.pk for run in earlier if executing(run, now)]
    return max(live) if live else None


def replace(earlier: Iterable[Run], *, new_run_id: int, slot: datetime, now: datetime) -> None:
    """In the tick's transaction, once the new slot's run exists: each earlier run gets a ``replaced``
    event, then is cancelled (at once if it waits, by a cancel request if it executes)."""
    by = f"run {new_run_id} (slot {iso_utc(slot)})"
    for run in earlier:
        events.record(run, EventType.REPLACED, now=now, message=f"replaced by {by}")
        cancel_locked(run, now=now, reason=f"by overlap=replace: replaced by {by}")


def release_replacements(ended_run_ids: Collection[int], now: datetime, *, why: str = "has ended") -> list[int]:
    """In the transaction that took these runs out of leased/running: the runs blocked behind
    them (``held_by = "run:<id>"``) become ``pending`` now, with an ``unblocked`` event and a
    wake-up at commit. Returns their ids. One indexed query when nothing waits (the usual case).

    A blocked run whose schedule still has another earlier run executing (possible when it
    was ``overlap=allow`` before) waits for that one instead (``held_by`` moves to it)."""
    if not ended_run_ids:
        return []
    ended = set(ended_run_ids)
    qs = Run.objects.filter(state=RunState.BLOCKED, held_by__in=sorted(holder(i) for i in ended)).order_by("id")
    blocked = list(locks.row_locked(qs).values_list("id", "schedule_id", "queue", "held_by"))
    if not blocked:
        return []
    still = _still_executing({schedule_id for _, schedule_id, _, _ in blocked if schedule_id}, ended, now)
    released: list[tuple[int, str, str]] = []
    for run_id, schedule_id, queue, held_by in blocked:
        other = max((r for r in still.get(schedule_id, ()) if r < run_id), default=None)
        if other is not None:
            Run.objects.filter(pk=run_id, state=RunState.BLOCKED).update(held_by=holder(other), updated_at=now)
            events.record(
                run_id, EventType.BLOCKED, now=now, message=f"waiting for run {other} (overlap=replace) to end"
            )
        else:
            released.append((run_id, queue, held_by))
    if not released:
        return []
    ids = [run_id for run_id, _, _ in released]
    Run.objects.filter(pk__in=ids, state=RunState.BLOCKED).update(
        state=RunState.PENDING, available_at=now, held_by="", updated_at=now
    )
    events.record_many(
        events.NewEvent(
            run_id=run_id,
            event_type=EventType.UNBLOCKED,
            now=now,
            message=f"run {holder_id(held_by)} it replaces {why}",
        )
        for run_id, _, held_by in released
    )
    notify.notify(queue for _, queue, _ in released)  # delivered at commit
    return ids


def _still_executing(schedule_ids: set[int], ended: set[int], now: datetime) -> dict[int, list[int]]:
    """Runs of these schedules, other than ``ended``, that hold a live lease."""
    if not schedule_ids:
        return {}
    rows = (
        Run.objects.filter(schedule_id__in=sorted(schedule_ids), state__in=LEASED_STATES, lease_expires_at__gt=now)
        .exclude(pk__in=sorted(ended))
        .values_list("schedule_id", "id")
    )
    out: dict[int, list[int]] = {}
    for schedule_id, run_id in rows:
        out.setdefault(schedule_id, []).append(run_id)
    return out


def sweep_replacements(now: datetime) -> int:
    """The safety net (a periodic chore, safe to run twice): release the runs blocked behind a run
    that no longer executes, because it ended (a missed release), went back to waiting, is gone,
    or its lease expired (its worker died: the replacement need not wait for the recovery).
    Returns how many were released."""
    with transaction.atomic():
        holders = {
            run_id
            for held_by in Run.objects.filter(state=RunState.BLOCKED, held_by__startswith=HOLDER_PREFIX)
            .values_list("held_by", flat=True)
            .distinct()
            if (run_id := holder_id(held_by)) is not None
        }
        if not holders:
            return 0
        live = Run.objects.filter(pk__in=sorted(holders), state__in=LEASED_STATES, lease_expires_at__gt=now)
        gone = holders - set(live.values_list("id", flat=True))
        if not gone:
            return 0
        return len(release_replacements(gone, now, why="no longer executes (it ended, or its lease expired)"))
