"""The tick: turn due schedules into runs, exactly once per slot.

Safe with any number of concurrent tickers: on PostgreSQL each batch locks
its schedules with ``FOR UPDATE SKIP LOCKED`` (a second ticker skips them); on
SQLite the transaction starts with ``BEGIN IMMEDIATE`` so tickers serialise.
Either way the partial unique constraint on ``(schedule, scheduled_for)``
makes a duplicate generated run impossible rather than unlikely.

Overlap, per schedule: ``allow`` creates every slot's run; ``skip`` makes a slot
``skipped`` while an earlier run is active; ``replace`` cancels the earlier
active runs and blocks the new one behind any that still executes
(``services.replacement``), all in the tick's transaction.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, cast

from django.db import IntegrityError, transaction
from django.db.models import Q

from .. import tracing
from ..clock import iso_utc
from ..conf import conf
from ..db import bulk, locks, notify
from ..db.leader import Term
from ..errors import ValidationError
from ..models import ACTIVE_STATES, EventType, Origin, Overlap, Run, RunState, Schedule
from ..recurrence import plan_catch_up
from . import events, leader, replacement
from .enqueue import declared_priority
from .schedules import recurrence_of

logger = logging.getLogger("distsched")


@dataclass(slots=True)
class NewRun:
    """A run the tick creates: plain values, so 10,000 of them stay cheap."""

    schedule_id: int
    schedule_name: str
    task_name: str
    scheduled_for: datetime
    state: str
    queue: str = "default"
    priority: int = 0  # the task's declared priority (``enqueue.declared_priority``)
    note: str = ""
    held_by: str = ""  # blocked: the run it waits for ("run:<id>", overlap=replace)
    why: str = ""  # skipped or blocked: the event's message
    run_id: int = 0  # set once inserted


@dataclass(slots=True)
class DueSchedule:
    """The columns of a due schedule that the tick reads: a plain row, because
    building 10,000 model instances was a fifth of a big tick's time."""

    id: int
    name: str
    task_name: str
    kind: str
    interval_seconds: int | None
    cron: str
    timezone: str
    run_at: datetime | None
    next_run_at: datetime | None
    catch_up: str
    overlap: str
    queue: str


def _tick_attributes(created: list[NewRun], **_: object) -> dict[str, int]:
    return {
        "distsched.tick.runs_created": len(created),
        "distsched.tick.schedules": len({r.schedule_id for r in created}),
    }


@tracing.when_busy("distsched.tick", _tick_attributes)
def tick(*, now: datetime, batch_size: int | None = None, fence: Term | None = None) -> list[NewRun]:
    """Create the runs of every due schedule; returns what was created (a span
    ``distsched.tick`` when it created any, with OpenTelemetry).

    ``fence``: the leader's term; each batch's transaction first checks that it still
    leads (``leader.fenced``) and raises ``NotLeader`` before writing anything if not.
    """
    size = batch_size or conf.TICK_BATCH_SIZE
    created: list[NewRun] = []
    after: tuple[datetime, int] | None = None
    while True:
        runs, seen, after = _tick_batch(now, size, after, fence)
        created.extend(runs)
        if seen < size:
            return created


def _tick_batch(
    now: datetime, size: int, after: tuple[datetime, int] | None, fence: Term | None
) -> tuple[list[NewRun], int, tuple[datetime, int] | None]:
    with leader.fenced(fence):
        # Only what the recurrence needs: payloads are copied row to row in SQL.
        qs = Schedule.objects.due(now).order_by("next_run_at", "id")
        if after is not None:
            # Keyset continuation: start the index scan after the previous batch
            # instead of walking again over the entries it just updated.
            qs = qs.filter(Q(next_run_at__gt=after[0]) | Q(next_run_at=after[0], id__gt=after[1]))
        qs = locks.skip_locked(qs)
        schedules = [DueSchedule(*row) for row in qs.values_list(*TICK_FIELDS)[:size]]
        if not schedules:
            return [], 0, after
        # due(now) selects schedules with a next_run_at, so every one of these has it.
        last = (cast(datetime, schedules[-1].next_run_at), schedules[-1].id)
        busy = _schedules_with_active_runs([s.id for s in schedules if s.overlap == Overlap.SKIP])
        # overlap=replace: the runs the new slots replace, locked (services.replacement).
        earlier = replacement.earlier_runs([s.id for s in schedules if s.overlap == Overlap.REPLACE])
        replacing: list[tuple[NewRun, list[Run]]] = []
        new_runs: list[NewRun] = []
        priorities: dict[str, int] = {}  # task -> its declared priority, looked up once a batch
        for schedule in schedules:
            try:
                plan = plan_catch_up(
                    recurrence_of(schedule),
                    next_run_at=cast(datetime, schedule.next_run_at),
                    now=now,
                    policy=schedule.catch_up,
                    max_catch_up=conf.MAX_CATCH_UP,
                    misfire_grace_seconds=conf.MISFIRE_GRACE_SECONDS,
                )
            except ValidationError as exc:
                # A stored recurrence that no longer validates (e.g. a cron extension written
                # before the strict dialect, or by SQL): skip it, so it shows as overdue, and
                # keep ticking the others. next_run_at is written back unchanged.
                logger.error(
                    "schedule skipped: invalid recurrence",
                    extra={"distsched": {"schedule": schedule.name, "error": str(exc)}},
                )
                continue
            for index, slot in enumerate(plan.slots):
                note = (
                    f"catch-up={schedule.catch_up}: {plan.dropped} missed slot(s) not run"
                    if index == 0 and plan.dropped
                    else ""
                )
                run = NewRun(
                    schedule_id=schedule.id,
                    schedule_name=schedule.name,
                    task_name=schedule.task_name,
                    scheduled_for=slot,
                    state=RunState.PENDING,
                    queue=schedule.queue,
                    priority=_priority(priorities, schedule.task_name),
                    note=note,
                )
                if schedule.overlap == Overlap.SKIP:
                    if schedule.id in busy:
                        run.state, run.why = RunState.SKIPPED, SKIPPED_BUSY
                    busy.add(schedule.id)
                elif schedule.overlap == Overlap.REPLACE:
                    _plan_replacement(run, plan.slots[-1], earlier.get(schedule.id, []), replacing, now)
                new_runs.append(run)
            if plan.next_run_at is not None and plan.next_run_at <= now:
                raise RuntimeError(f"recurrence did not advance past now for {schedule.name!r}")
            schedule.next_run_at = plan.next_run_at
        inserted = _insert(new_runs, now)
        events.record_many(_creation_events(inserted, now))
        for run, replaced in replacing:
            if run.run_id:  # inserted (a slot that already had a run replaces nothing)
                replacement.replace(replaced, new_run_id=run.run_id, slot=run.scheduled_for, now=now)
        _set_next_run_at(schedules)
        notify.notify(run.queue for run in inserted if run.state == RunState.PENDING)  # delivered at commit
    if inserted:
        logger.info("tick created runs", extra={"distsched": {"runs": len(inserted), "schedules": len(schedules)}})
    if logger.isEnabledFor(logging.DEBUG):
        for run in inserted:
            logger.debug(
                "run created",
                extra={
                    "distsched": {
                        "run_id": run.run_id,
                        "schedule": run.schedule_name,
                        "task": run.task_name,
                        "state": run.state,
                    }
                },
            )
    return inserted, len(schedules), last


SKIPPED_BUSY = "an earlier run of this schedule is still active (overlap=skip)"


def _priority(known: dict[str, int], task_name: str) -> int:
    if task_name not in known:
        known[task_name] = declared_priority(task_name)
    return known[task_name]


def _plan_replacement(
    run: NewRun, last_slot: datetime, earlier: list[Run], replacing: list[tuple[NewRun, list[Run]]], now: datetime
) -> None:
    """overlap=replace: only the tick's last slot gets a run that may execute; an earlier
    catch-up slot of the same tick is ``skipped`` (it would be replaced at once). The last
    slot's run is ``blocked`` behind an earlier run that still executes, else ``pending``; once
    it is inserted, the earlier runs are cancelled (``replacement.replace``)."""
    if run.scheduled_for != last_slot:
        run.state = RunState.SKIPPED
        run.why = f"the later slot {iso_utc(last_slot)} of the same tick replaces it (overlap=replace)"
        return
    if (holder := replacement.waits_for(earlier, now)) is not None:
        run.state, run.held_by = RunState.BLOCKED, replacement.holder(holder)
        run.why = f"waiting for run {holder} (overlap=replace) to end"
    if earlier:
        replacing.append((run, earlier))


def _schedules_with_active_runs(schedule_ids: list[int]) -> set[int]:
    if not schedule_ids:
        return set()
    return set(
        Run.objects.filter(schedule_id__in=schedule_ids, state__in=ACTIVE_STATES)
        .values_list("schedule_id", flat=True)
        .distinct()
    )


TICK_FIELDS = tuple(field.name for field in fields(DueSchedule))


def _run_values(now: datetime) -> dict[str, str | bulk.Bind]:
    """Every field of a slot's new run: from the slot (u), its schedule row (s), or bound once."""
    return {
        "schedule": "u.schedule_id",
        "task_name": "s.task_name",
        "args": "s.args",
        "kwargs": "s.kwargs",
        "state": "u.state",
        "scheduled_for": "u.scheduled_for",
        "available_at": "u.scheduled_for",
        "attempts": "0",
        "max_attempts": "s.max_attempts",
        "lease_owner": "''",
        "lease_expires_at": "NULL",
        "started_at": "NULL",
        "finished_at": "u.finished_at",
        "last_error": "''",
        "result": "NULL",
        "queue": "s.queue",
        "priority": "u.priority",
        "origin": bulk.Bind(Origin.SCHEDULE.value),
        "idempotency_key": "u.idempotency_key",
        "cancel_requested": "false",
        "held_by": "u.held_by",
        "schedule_version": "s.version",
        "created_at": bulk.Bind(now),
        "updated_at": bulk.Bind(now),
    }


def _insert(runs: list[NewRun], now: datetime) -> list[NewRun]:
    if not runs:
        return []
    try:
        with transaction.atomic():
            _insert_runs(runs, now)
            return runs
    except IntegrityError:
        # Only reachable if a slot already has a run (e.g. next_run_at was
        # moved back by hand): keep the existing run, create the others.
        inserted = []
        for run in runs:
            try:
                with transaction.atomic():
                    _insert_runs([run], now)
                inserted.append(run)
            except IntegrityError:
                logger.warning(
                    "slot already has a run",
                    extra={"distsched": {"schedule": run.schedule_name, "scheduled_for": iso_utc(run.scheduled_for)}},
                )
        return inserted


def _insert_runs(runs: list[NewRun], now: datetime) -> None:
    """INSERT ... SELECT ... RETURNING: the tick's hot path, written as SQL because
    building model instances for ``bulk_create`` cost more than the statement.
    Payload, attempts budget and queue are copied from the schedule row by the
    database, so the tick never decodes and re-encodes JSON. Ids follow the order
    of ``runs`` (slot order), whatever join the database picks."""
    slots: dict[str, list[Any]] = {  # what the tick knows of each new run; the schedule row supplies the rest
        "schedule": [run.schedule_id for run in runs],
        "state": [run.state for run in runs],
        "scheduled_for": [run.scheduled_for for run in runs],
        "finished_at": [now if run.state == RunState.SKIPPED else None for run in runs],
        "idempotency_key": [f"{run.schedule_name}:{run.scheduled_for.isoformat()}" for run in runs],
        "held_by": [run.held_by for run in runs],
        "priority": [run.priority for run in runs],
    }
    returned = bulk.insert_rows(
        Run,
        slots,
        select=_run_values(now),
        join=f"JOIN {bulk.table(Schedule)} s ON s.id = u.schedule_id",
        ordered=True,
        returning=("id", "schedule", "scheduled_for"),
    )
    # RETURNING order is not guaranteed: match rows on their unique slot.
    by_slot = {(run.schedule_id, run.scheduled_for): run for run in runs}
    for pk, schedule_id, slot in returned:
        by_slot[(schedule_id, slot)].run_id = pk


def _set_next_run_at(schedules: list[DueSchedule]) -> None:
    """One UPDATE ... FROM (rows) instead of a CASE per row."""
    bulk.update_from_rows(
        Schedule, "id", {"id": [s.id for s in schedules], "next_run_at": [s.next_run_at for s in schedules]}
    )


def _creation_events(runs: list[NewRun], now: datetime) -> list[events.NewEvent]:
    out = []
    for run in runs:
        out.append(events.NewEvent(run_id=run.run_id, event_type=EventType.CREATED, now=now, message=run.note))
        if run.state == RunState.SKIPPED:
            out.append(events.NewEvent(run_id=run.run_id, event_type=EventType.SKIPPED, now=now, message=run.why))
        elif run.state == RunState.BLOCKED:
            out.append(events.NewEvent(run_id=run.run_id, event_type=EventType.BLOCKED, now=now, message=run.why))
    return out
