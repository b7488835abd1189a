"""Read-only row sets for list screens (API, admin): no writes, no clock reads.

Each function returns a lazy QuerySet so the caller can filter and paginate
it without loading a million rows; the joins a list needs are made here, once,
so a page costs the same number of queries whatever its size.
"""

from __future__ import annotations

from django.db.models import F, Q, QuerySet
from django.db.models.functions import Coalesce

from ..models import Run, RunEvent, Schedule, Worker


def schedules() -> QuerySet[Schedule]:
    return Schedule.objects.all()


def runs() -> QuerySet[Run]:
    """All runs, with their schedule's name joined in as ``schedule_name`` (the name a run kept
    when its schedule was deleted, ``None`` for an enqueued run).

    An annotation rather than ``select_related``: a list needs one column of
    the schedule, not its (possibly large) JSON payload on every row.
    """
    return Run.objects.annotate(schedule_name=Coalesce(F("schedule__name"), F("deleted_schedule")))


def schedule_runs_q(name: str) -> Q:
    """The runs of the schedule named ``name``, as a condition on an indexed column.

    The name is resolved first (one lookup of the unique name), so the list walks the
    ``(schedule, -id)`` index: a join on the name let the planner walk every run newest first
    until 51 matched, the whole table for an idle schedule. A name no schedule has means the
    runs a deleted schedule of that name left (``deleted_schedule``, its own small index); an
    unknown name matches nothing, found without reading a run.
    """
    schedule_id = Schedule.objects.filter(name=name).values_list("id", flat=True).first()
    return Q(deleted_schedule=name) if schedule_id is None else Q(schedule_id=schedule_id)


def priority_q(priority: int) -> Q:
    """Runs of one priority; off the default, with the condition of the ``(priority, -id)`` partial
    index repeated, which SQLite needs to use it (PostgreSQL infers it)."""
    return Q(priority=priority) if priority == 0 else Q(priority=priority) & ~Q(priority=0)


def run_events(run_id: int) -> QuerySet[RunEvent]:
    """One run's history, in the order it happened."""
    return RunEvent.objects.filter(run_id=run_id).order_by("id")


def last_run(schedule: Schedule) -> Run | None:
    """The schedule's most recently created run (highest id), or None."""
    return (
        Run.objects.filter(schedule=schedule)
        .order_by("-id")
        .only("id", "state", "scheduled_for", "finished_at")
        .first()
    )


def workers() -> QuerySet[Worker]:
    return Worker.objects.all()
