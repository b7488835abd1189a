"""The tick: turn due schedules into runs, exactly once per slot.

Safe with any number of concurrent tickers: on PostgreSQL each batch locks
its schedules with ``FOR UPDATE SKIP LOCKED`` (a second ticker skips them); on
SQLite the transaction starts with ``BEGIN IMMEDIATE`` so tickers serialise.
Either way the partial unique constraint on ``(schedule, scheduled_for)``
makes a duplicate generated run impossible rather than unlikely.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import IntegrityError, connection, transaction

from ..conf import conf
from ..models import ACTIVE_STATES, EventType, Origin, Overlap, Run, RunState, Schedule
from ..recurrence import plan_catch_up
from . import events
from .schedules import recurrence_of

logger = logging.getLogger("distsched")


def tick(*, now: datetime, batch_size: int | None = None) -> list[Run]:
    """Create the runs of every due schedule; returns the runs created."""
    size = batch_size or conf.TICK_BATCH_SIZE
    created: list[Run] = []
    while True:
        runs, seen = _tick_batch(now, size)
        created.extend(runs)
        if seen < size:
            return created


def _tick_batch(now: datetime, size: int) -> tuple[list[Run], int]:
    with transaction.atomic():
        qs = Schedule.objects.due(now).order_by("next_run_at", "id")
        if connection.features.has_select_for_update_skip_locked:
            qs = qs.select_for_update(skip_locked=True)
        schedules = list(qs[:size])
        if not schedules:
            return [], 0
        busy = _schedules_with_active_runs([s.pk for s in schedules if s.overlap == Overlap.SKIP])
        new_runs: list[Run] = []
        notes: dict[int, str] = {}
        for schedule in schedules:
            plan = plan_catch_up(
                recurrence_of(schedule),
                next_run_at=schedule.next_run_at,
                now=now,
                policy=schedule.catch_up,
                max_catch_up=conf.MAX_CATCH_UP,
                misfire_grace_seconds=conf.MISFIRE_GRACE_SECONDS,
            )
            for index, slot in enumerate(plan.slots):
                skip = schedule.overlap == Overlap.SKIP and schedule.pk in busy
                run = _new_run(schedule, slot, now, skipped=skip)
                if index == 0 and plan.dropped:
                    notes[id(run)] = f"catch-up={schedule.catch_up}: {plan.dropped} missed slot(s) not run"
                if schedule.overlap == Overlap.SKIP:
                    busy.add(schedule.pk)
                new_runs.append(run)
            if plan.next_run_at is not None and plan.next_run_at <= now:
                raise RuntimeError(f"recurrence did not advance past now for {schedule.name!r}")
            schedule.next_run_at = plan.next_run_at
        inserted = _insert(new_runs)
        events.record_many(_creation_events(inserted, notes, now))
        Schedule.objects.bulk_update(schedules, ["next_run_at"], batch_size=500)
    if inserted:
        logger.info("tick created runs", extra={"distsched": {"runs": len(inserted), "schedules": len(schedules)}})
    for run in inserted:
        logger.debug(
            "run created",
            extra={"distsched": {"run_id": run.pk, "schedule": run.schedule.name,
                                 "task": run.task_name, "state": run.state}},
        )
    return inserted, len(schedules)


def _schedules_with_active_runs(schedule_ids: list[int]) -> set[int]:
    if not schedule_ids:
        return set()
    return set(
        Run.objects.filter(schedule_id__in=schedule_ids, state__in=ACTIVE_STATES)
        .values_list("schedule_id", flat=True)
        .distinct()
    )


def _new_run(schedule: Schedule, slot: datetime, now: datetime, *, skipped: bool) -> Run:
    return Run(
        schedule=schedule,
        task_name=schedule.task_name,
        args=schedule.args,
        kwargs=schedule.kwargs,
        state=RunState.SKIPPED if skipped else RunState.PENDING,
        scheduled_for=slot,
        available_at=slot,
        max_attempts=schedule.max_attempts,
        queue=schedule.queue,
        origin=Origin.SCHEDULE,
        idempotency_key=f"{schedule.name}:{slot.isoformat()}",
        finished_at=now if skipped else None,
        created_at=now,
        updated_at=now,
    )


def _insert(runs: list[Run]) -> list[Run]:
    if not runs:
        return []
    try:
        with transaction.atomic():
            return Run.objects.bulk_create(runs, batch_size=500)
    except IntegrityError:
        # Only reachable if a slot already has a run (e.g. next_run_at was
        # moved back by hand): keep the existing run, create the others.
        inserted = []
        for run in runs:
            try:
                with transaction.atomic():
                    run.save(force_insert=True)
                inserted.append(run)
            except IntegrityError:
                logger.warning("slot already has a run", extra={"distsched": {"run": run.idempotency_key}})
        return inserted


def _creation_events(runs: list[Run], notes: dict[int, str], now: datetime) -> list[events.NewEvent]:
    out = []
    for run in runs:
        out.append(events.NewEvent(run_id=run.pk, event_type=EventType.CREATED, now=now,
                                   message=notes.get(id(run), "")))
        if run.state == RunState.SKIPPED:
            out.append(events.NewEvent(
                run_id=run.pk, event_type=EventType.SKIPPED, now=now,
                message="an earlier run of this schedule is still active (overlap=skip)",
            ))
    return out
