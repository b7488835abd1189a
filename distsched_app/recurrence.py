"""Pure schedule maths: when a schedule fires, and what to do about missed slots.

No ORM and no clock: every function is given ``now`` or a slot by its caller,
so the tick, the services and the tests all drive time explicitly. Datetimes
in and out are timezone-aware; results are UTC.

Kinds
    * ``once``: fires at ``run_at``, then never again.
    * ``interval``: fires at ``start_at`` (else at creation), then every
      ``interval_seconds``. Pure UTC arithmetic from the previous slot: no
      drift, and DST never affects it.
    * ``cron``: a standard 5-field expression (minute hour day month weekday)
      evaluated on the wall clock of the schedule's IANA time zone. The
      dialect is strict (``distsched_app.cron``: numbers, names, ``*``, lists,
      ranges, steps; none of croniter's extensions) and days follow Vixie
      cron: ``0 9 1-7 * MON`` fires on the 1st-7th and on every Monday,
      ``0 9 */2 * MON`` only on odd-numbered days that are Mondays.

Daylight saving time (the rule of classic cron, which avoids both "ran twice"
and "lost an hour")
    * Spring forward: a slot whose local time does not exist fires once, at
      the first valid instant after the gap, merged with any slot already at
      that instant. Europe/Paris on 2026-03-29: ``30 2 * * *`` fires at
      03:00 CEST (01:00 UTC); ``*/15 * * * *`` fires at 01:45 CET, then once at
      03:00 CEST for 02:00, 02:15, 02:30, 02:45 and 03:00, then at 03:15 CEST.
    * Fall back: if the hour field is fixed (no ``*`` and no ``/``:
      ``30 1 * * *``, ``0 9,17 * * *``, ``0 1-3 * * *``), a repeated local
      time fires once, at its first occurrence. If the hour field is a
      wildcard or a step (``*``, ``*/2``, ``1-5/2``), the schedule keeps its
      real-time cadence and fires at both occurrences: hourly ``0 * * * *`` in
      America/New_York on 2026-11-01 fires at 01:00 EDT (05:00 UTC) and again
      at 01:00 EST (06:00 UTC).
    * Stored times are UTC, so changing ``settings.TIME_ZONE`` never moves a
      schedule.

Catch-up, for the missed slots ``s`` with ``next_run_at <= s <= now``
    * ``one``: one run, for the most recent slot.
    * ``all``: a run per slot, the most recent ``max_catch_up`` of them.
    * ``skip``: a run only for slots with ``now - s <= misfire_grace_seconds``
      (so normal ticking loses nothing while a long outage is skipped), at
      most ``max_catch_up`` of them.
    In every case the new ``next_run_at`` is the first slot after ``now``
    (``None`` for a ``once`` schedule). Interval slots are counted by
    arithmetic, whatever the outage. Cron slots are enumerated: the chosen
    slots are always right, but ``dropped`` is exact only up to
    ``COUNT_BUDGET`` missed slots; beyond that it is a lower bound, which keeps
    a tick after a long outage fast.
"""

from __future__ import annotations

import math
import zoneinfo
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import chain, islice

from croniter import CroniterBadDateError, croniter

from . import cron
from .errors import InvalidInterval, InvalidScheduleSpec, UnknownTimezone

ONCE, INTERVAL, CRON = "once", "interval", "cron"
CATCH_UP_ONE, CATCH_UP_ALL, CATCH_UP_SKIP = "one", "all", "skip"

# Missed cron slots counted one by one before `dropped` becomes a lower bound.
COUNT_BUDGET = {CATCH_UP_ONE: 1_000, CATCH_UP_SKIP: 1_000, CATCH_UP_ALL: 10_000}
# Any single walk over cron slots stops here: every loop has an exit.
_WALK_LIMIT = 100_000
_TINY = timedelta(microseconds=1)


@dataclass(frozen=True, kw_only=True)
class Recurrence:
    """When a schedule fires, detached from the model so the maths stays pure."""

    kind: str
    interval_seconds: int | None = None
    cron: str = ""
    timezone: str = "UTC"
    run_at: datetime | None = None


@dataclass(frozen=True, kw_only=True)
class CatchUpPlan:
    """What the tick should do for one due schedule."""

    slots: tuple[datetime, ...]
    dropped: int
    next_run_at: datetime | None


# --------------------------------------------------------------------------
# Validation


def validate_cron(expr: str) -> str:
    """Return the normalised expression (see ``distsched_app.cron``), or raise ``InvalidCron``.

    Standard five fields only: croniter's extensions (random ``R``, hash
    ``H``, Quartz ``L W # ?``, seconds and years) are refused, since the DST
    rules and the minute-level tick do not account for them. An expression
    that never matches (``0 0 30 2 *``) is rejected too, rather than stalling later.
    """
    return cron.normalise(expr)


def get_zone(name: str) -> zoneinfo.ZoneInfo:
    """Load an IANA zone, or raise ``UnknownTimezone``.

    ``localtime`` is refused: it names the host's zone, and a schedule must not
    move when it runs on another machine.
    """
    if not isinstance(name, str) or not name or name == "localtime":
        raise UnknownTimezone(f"unknown time zone {name!r}")
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError, OSError):
        raise UnknownTimezone(f"unknown time zone {name!r}") from None


def _utc(dt: datetime, what: str) -> datetime:
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware, got {dt!r}")
    return dt.astimezone(UTC)


def _interval(rec: Recurrence) -> timedelta:
    seconds = rec.interval_seconds
    if seconds is None or isinstance(seconds, bool) or seconds <= 0:
        raise InvalidInterval(f"interval_seconds must be a positive number, not {seconds!r}")
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise InvalidInterval(f"interval_seconds {seconds!r} is too large") from None


def _unknown_kind(rec: Recurrence) -> InvalidScheduleSpec:
    return InvalidScheduleSpec(f"unknown schedule kind {rec.kind!r} (expected once, interval or cron)")


# --------------------------------------------------------------------------
# Slots


def first_slot(rec: Recurrence, *, now: datetime, start_at: datetime | None = None) -> datetime | None:
    """The first slot of a new (or changed) schedule.

    once: ``run_at``; interval: ``start_at``, else ``now`` (a tick right after
    creation runs it); cron: the first match at or after ``start_at`` or ``now``.
    """
    if rec.kind == ONCE:
        if rec.run_at is None:
            raise InvalidScheduleSpec("a once schedule needs run_at")
        return _utc(rec.run_at, "run_at")
    start = _utc(start_at if start_at is not None else now, "start_at" if start_at is not None else "now")
    if rec.kind == INTERVAL:
        _interval(rec)
        return start
    if rec.kind == CRON:
        return next(_cron_slots(rec, start - _TINY), None)
    raise _unknown_kind(rec)


def next_slot_after(rec: Recurrence, slot: datetime) -> datetime | None:
    """The slot following ``slot``: computed from the slot, never from "now", so no drift."""
    slot = _utc(slot, "slot")
    if rec.kind == ONCE:
        return None
    if rec.kind == INTERVAL:
        try:
            return slot + _interval(rec)
        except OverflowError:
            return None
    if rec.kind == CRON:
        return next(_cron_slots(rec, slot), None)
    raise _unknown_kind(rec)


def upcoming(rec: Recurrence, next_run_at: datetime | None, count: int = 5) -> list[datetime]:
    """``next_run_at`` and the slots after it, ``count`` in all (for display)."""
    if next_run_at is None or count <= 0:
        return []
    first = _utc(next_run_at, "next_run_at")
    if rec.kind == ONCE:
        return [first]
    if rec.kind == INTERVAL:
        step = _interval(rec)
        return [first + k * step for k in range(count)]
    if rec.kind == CRON:
        return [first, *islice(_cron_slots(rec, first), count - 1)]
    raise _unknown_kind(rec)


# --------------------------------------------------------------------------
# Catch-up


def plan_catch_up(
    rec: Recurrence,
    *,
    next_run_at: datetime,
    now: datetime,
    policy: str,
    max_catch_up: int,
    misfire_grace_seconds: float,
) -> CatchUpPlan:
    """Decide which missed slots get a run, and where ``next_run_at`` goes.

    The returned ``next_run_at`` is always after ``now`` (or ``None`` for a
    spent once schedule), so the tick never sees the same slot twice.
    """
    if policy not in COUNT_BUDGET:
        raise ValueError(f"unknown catch-up policy {policy!r} (expected one, all or skip)")
    next_run_at = _utc(next_run_at, "next_run_at")
    now = _utc(now, "now")
    if next_run_at > now:
        return CatchUpPlan(slots=(), dropped=0, next_run_at=next_run_at)
    # A cap below 1 would make 'all' lose even the latest slot: worse than 'one'.
    cap = max(1, int(max_catch_up))
    grace = timedelta(seconds=max(0.0, float(misfire_grace_seconds)))

    if rec.kind == ONCE:
        if policy == CATCH_UP_SKIP and now - next_run_at > grace:
            return CatchUpPlan(slots=(), dropped=1, next_run_at=None)
        return CatchUpPlan(slots=(next_run_at,), dropped=0, next_run_at=None)
    if rec.kind == INTERVAL:
        return _plan_interval(_interval(rec), next_run_at, now, policy, cap, grace)
    if rec.kind == CRON:
        return _plan_cron(rec, next_run_at, now, policy, cap, grace)
    raise _unknown_kind(rec)


def _plan_interval(
    step: timedelta, first: datetime, now: datetime, policy: str, cap: int, grace: timedelta
) -> CatchUpPlan:
    # Slot k is first + k*step; integer timedelta division, so a 1 s interval
    # after a week's outage costs the same as after a minute's.
    missed = (now - first) // step + 1
    if policy == CATCH_UP_ONE:
        keep_from = missed - 1
    elif policy == CATCH_UP_ALL:
        keep_from = max(0, missed - cap)
    else:
        late = now - grace - first  # slots at or after first + late are within grace
        within = 0 if late <= timedelta(0) else -((-late) // step)  # ceil(late / step)
        keep_from = max(within, missed - cap)
    slots = tuple(first + k * step for k in range(keep_from, missed))
    return CatchUpPlan(slots=slots, dropped=missed - len(slots), next_run_at=first + missed * step)


def _plan_cron(rec: Recurrence, first: datetime, now: datetime, policy: str, cap: int, grace: timedelta) -> CatchUpPlan:
    keep = 1 if policy == CATCH_UP_ONE else cap
    recent: deque[datetime] = deque(maxlen=keep)
    counted = 0
    following: datetime | None = None
    frontier: datetime | None = None

    # Walk from next_run_at, counting, while the outage is short (the usual case).
    budget = COUNT_BUDGET[policy]
    for slot in chain((first,), _cron_slots(rec, first)):
        if slot > now:
            following = slot
            break
        recent.append(slot)
        counted += 1
        if counted >= budget:
            frontier = slot
            break

    if frontier is not None:
        # A long outage: stop counting and find the slots that matter, the most
        # recent ones, in a window before `now` that doubles until it holds
        # enough of them (or reaches back to where the count stopped).
        span = timedelta(hours=1)
        while True:
            start = now - span
            if policy == CATCH_UP_SKIP:
                start = max(start, now - grace)
            after = max(frontier, start - _TINY)
            window: deque[datetime] = deque(maxlen=keep)
            seen = 0
            following = None
            for slot in _cron_slots(rec, after):
                if slot > now:
                    following = slot
                    break
                window.append(slot)
                seen += 1
                if seen >= _WALK_LIMIT:
                    break
            reached_back = after == frontier or (policy == CATCH_UP_SKIP and start == now - grace)
            if reached_back or len(window) >= keep:
                counted += seen
                recent.extend(window)
                break
            span *= 2

    if following is None:
        # The walk ended on a limit, or the expression has no later match.
        following = next(_cron_slots(rec, now), None)
    if policy == CATCH_UP_SKIP:
        slots = tuple(s for s in recent if now - s <= grace)
    else:
        slots = tuple(recent)
    return CatchUpPlan(slots=slots, dropped=counted - len(slots), next_run_at=following)


# --------------------------------------------------------------------------
# Cron on a wall clock


def _cron_slots(rec: Recurrence, after: datetime) -> Iterator[datetime]:
    """Yield the cron instants strictly after ``after`` (UTC), ascending, without duplicates.

    croniter walks naive local times, given only the number lists and day rule
    of the parsed expression; each is mapped to UTC by the DST rule in the
    module docstring. Real time only runs backwards on the wall clock
    inside a repeated hour, so when both occurrences fire, the local times of
    that hour are gathered and emitted first-occurrence then second-occurrence.
    """
    zone = get_zone(rec.timezone)
    spec = cron.parse(rec.cron)  # InvalidCron for a stored expression the dialect refuses
    expr, day_or = spec.croniter_args
    both_folds = spec.hour_wildcard
    wall = after.astimezone(zone).replace(tzinfo=None, fold=0)
    start = wall
    placed = _place(wall, zone)
    if placed[0] == "repeated":
        # `after` lies inside a repeated hour: restart from its beginning, so
        # second occurrences of earlier local times are not missed.
        start = _repeat_bounds(placed[1], placed[2], zone)[0] - _TINY
    walker = croniter(expr, start, day_or=day_or)

    last = after
    pending: datetime | None = None
    while True:
        if pending is not None:
            local, pending = pending, None
        else:
            try:
                local = walker.get_next(datetime)
            except CroniterBadDateError:
                return  # no further match
        kind, fold0, fold1 = _place(local, zone)
        if kind == "normal":
            instants: list[datetime] = [fold0]
        elif kind == "gap":
            # fold=1 reads the time with the offset after the change: the earlier instant.
            instants = [_transition(fold1, fold0, zone)]
        elif not both_folds:
            instants = [fold0]
        else:
            repeat_end = _repeat_bounds(fold0, fold1, zone)[1]
            block = [local]
            while True:
                try:
                    nxt = walker.get_next(datetime)
                except CroniterBadDateError:
                    break
                if nxt >= repeat_end:
                    pending = nxt
                    break
                block.append(nxt)
            firsts = [_place(t, zone)[1] for t in block]
            seconds = [_place(t, zone)[2] for t in block]
            instants = firsts + seconds
        for instant in instants:
            if instant > last:
                last = instant
                yield instant


def _place(local: datetime, zone: zoneinfo.ZoneInfo) -> tuple[str, datetime, datetime]:
    """Classify a naive local time: ``normal``, ``repeated`` or ``gap``.

    Returns the UTC instants read with ``fold=0`` and ``fold=1`` (PEP 495):
    for a repeated time, the first and second occurrences; in a gap, the
    time read with the offsets before and after the change.
    """
    fold0 = local.replace(tzinfo=zone, fold=0).astimezone(UTC)
    fold1 = local.replace(tzinfo=zone, fold=1).astimezone(UTC)
    if fold0 == fold1:
        return "normal", fold0, fold0
    if fold0.astimezone(zone).replace(tzinfo=None) == local:
        return "repeated", fold0, fold1
    return "gap", fold0, fold1


def _transition(lo: datetime, hi: datetime, zone: zoneinfo.ZoneInfo) -> datetime:
    """The first instant after ``lo`` whose UTC offset differs from ``lo``'s (``hi`` has the new one).

    Binary search to the second: zone transitions happen on whole seconds.
    """
    base = lo.replace(microsecond=0)
    before = base.astimezone(zone).utcoffset()
    low, high = 0, math.ceil((hi - base).total_seconds())
    while high - low > 1:
        mid = (low + high) // 2
        if (base + timedelta(seconds=mid)).astimezone(zone).utcoffset() == before:
            low = mid
        else:
            high = mid
    return base + timedelta(seconds=high)


def _repeat_bounds(first: datetime, second: datetime, zone: zoneinfo.ZoneInfo) -> tuple[datetime, datetime]:
    """Naive local ``[start, end)`` of the repeated hour, given both occurrences of a time in it."""
    change = _transition(first, second, zone)
    start = change.astimezone(zone).replace(tzinfo=None, fold=0)
    return start, start + (second - first)
