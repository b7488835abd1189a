"""Read-only figures for the admin dashboard: hourly outcomes and overdue schedules.

Nothing here writes. The hourly outcomes are counted from the run history
(``RunEvent``), not from the current state of runs, so a run that died and
was requeued still shows its death in the hour it happened, and a retried
attempt counts once per retry.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from django.db.models import Count

from ..conf import conf
from ..db.expressions import UTCHour
from ..models import EventType, RunEvent, Schedule

# The event that ends an attempt, by the outcome it stands for (chart order, bottom up).
OUTCOME_EVENTS: dict[str, str] = {
    "succeeded": EventType.SUCCEEDED,
    "retried": EventType.RETRY_SCHEDULED,
    "dead": EventType.MARKED_DEAD,
    "cancelled": EventType.CANCELLED,
}
OUTCOMES: tuple[str, ...] = tuple(OUTCOME_EVENTS)


@dataclass(frozen=True, kw_only=True)
class HourOutcomes:
    start: datetime
    counts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def hour_floor(moment: datetime) -> datetime:
    return moment.astimezone(timezone.utc).replace(minute=0, second=0, microsecond=0)


def outcomes_per_hour(*, now: datetime, hours: int = 24) -> list[HourOutcomes]:
    """Attempts ended per UTC hour by outcome, oldest hour first; the last hour is the current one.

    One grouped query on the ``(event_type, created_at)`` index, whatever the
    number of runs.
    """
    current = hour_floor(now)
    first = current - timedelta(hours=hours - 1)
    outcome_of = {event: outcome for outcome, event in OUTCOME_EVENTS.items()}
    rows = (
        RunEvent.objects.filter(event_type__in=list(outcome_of), created_at__gte=first, created_at__lte=now)
        .annotate(hour=UTCHour("created_at"))
        .order_by()
        .values("hour", "event_type")
        .annotate(n=Count("id"))
    )
    buckets = {first + timedelta(hours=i): dict.fromkeys(OUTCOMES, 0) for i in range(hours)}
    for row in rows:
        bucket = buckets.get(hour_floor(row["hour"]))
        if bucket is not None:
            bucket[outcome_of[row["event_type"]]] += row["n"]
    return [HourOutcomes(start=start, counts=counts) for start, counts in buckets.items()]


def overdue_schedules(*, now: datetime, limit: int = 20) -> list[Schedule]:
    """Active schedules due for longer than the misfire grace: no ticker is running.

    The same definition as ``stats.schedules_overdue`` and the metrics gauge.
    """
    qs = Schedule.objects.overdue(now, conf.MISFIRE_GRACE_SECONDS).order_by("next_run_at", "id")
    return list(qs.only("id", "name", "task_name", "next_run_at")[:limit])
