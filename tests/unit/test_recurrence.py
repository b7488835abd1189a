"""Pure schedule maths: no database, no clock.

Every expected instant is written out by hand, with the local wall time it
stands for in a comment, so the tests do not echo the code under test.
Offsets used: Europe/Paris CET = UTC+1, CEST = UTC+2 (2026: spring forward
03-29 at 01:00 UTC, fall back 10-25 at 01:00 UTC); America/New_York
EST = UTC-5, EDT = UTC-4 (2026: spring forward 03-08 at 07:00 UTC, fall back
11-01 at 06:00 UTC).
"""

from __future__ import annotations

import itertools
import time
import zoneinfo
from datetime import UTC, datetime, timedelta, timezone

import pytest
from croniter import croniter

from distsched_app import recurrence
from distsched_app.errors import InvalidCron, InvalidInterval, InvalidScheduleSpec, UnknownTimezone
from distsched_app.recurrence import (
    CRON,
    INTERVAL,
    ONCE,
    CatchUpPlan,
    Recurrence,
    first_slot,
    get_zone,
    next_slot_after,
    plan_catch_up,
    upcoming,
    validate_cron,
)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def cron(expr: str, tz: str = "UTC") -> Recurrence:
    return Recurrence(kind=CRON, cron=expr, timezone=tz)


def every(seconds: int) -> Recurrence:
    return Recurrence(kind=INTERVAL, interval_seconds=seconds)


def chain_after(rec: Recurrence, after: datetime, count: int) -> list[datetime]:
    """``count`` successive next_slot_after calls, each from the previous slot."""
    out = []
    for _ in range(count):
        after = next_slot_after(rec, after)
        out.append(after)
    return out


def plan(
    rec: Recurrence, *, next_run_at: datetime, now: datetime, policy: str, max_catch_up: int = 100, grace: float = 60
) -> CatchUpPlan:
    return plan_catch_up(
        rec, next_run_at=next_run_at, now=now, policy=policy, max_catch_up=max_catch_up, misfire_grace_seconds=grace
    )


# --- validate_cron -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "normalised"),
    [
        ("*/5 * * * *", "*/5 * * * *"),
        ("  0   9  * *\tMON-FRI ", "0 9 * * MON-FRI"),
        ("30 1 * JAN *", "30 1 * JAN *"),
        ("1-5/2 9,17 1 1 0", "1-5/2 9,17 1 1 0"),
        ("0 0 29 2 *", "0 0 29 2 *"),  # leap day: rare, but it does fire
    ],
)
def test_validate_cron_accepts_and_normalises(expr, normalised):
    assert validate_cron(expr) == normalised


@pytest.mark.parametrize(
    "expr",
    [
        "",
        "   ",
        "garbage",
        "* * * *",  # 4 fields
        "* * * * * *",  # 6 fields: croniter's seconds column
        "* * * * * * *",  # 7 fields: seconds and year
        "@daily",
        "60 * * * *",
        "0 24 * * *",
        "*/0 * * * *",
        "a b c d e",
        "0 0 30 2 *",  # 30 February never happens
    ],
)
def test_validate_cron_rejects(expr):
    with pytest.raises(InvalidCron) as info:
        validate_cron(expr)
    assert info.value.field == "cron"
    assert str(info.value)


@pytest.mark.parametrize("expr", ["0 0 L * *", "0 0 * * 5#3", "0 0 15W * *"])
def test_validate_cron_rejects_quartz_extensions_it_once_accepted(expr):
    # Quartz's last day, nth weekday and nearest weekday were accepted through croniter.
    with pytest.raises(InvalidCron, match="is not a number, name"):
        validate_cron(expr)


def test_validate_cron_rejects_non_string():
    with pytest.raises(InvalidCron):
        validate_cron(None)  # type: ignore[arg-type]


# --- get_zone --------------------------------------------------------------------------------


def test_get_zone_loads_iana_names():
    assert get_zone("Europe/Paris") == zoneinfo.ZoneInfo("Europe/Paris")
    assert get_zone("UTC").key == "UTC"
    assert get_zone("America/New_York").key == "America/New_York"


@pytest.mark.parametrize(
    "name", ["", "Nope/Zone", "Europe/Paris ", "../etc/passwd", "/etc/localtime", "localtime", "a\x00b", None]
)
def test_get_zone_rejects_unknown_names(name):
    with pytest.raises(UnknownTimezone) as info:
        get_zone(name)
    assert info.value.field == "timezone"


# --- first_slot ------------------------------------------------------------------------------


def test_first_slot_once_is_run_at_in_utc():
    run_at = datetime(2026, 5, 1, 12, 0, tzinfo=timezone(timedelta(hours=2)))
    slot = first_slot(Recurrence(kind=ONCE, run_at=run_at), now=utc(2026, 4, 1))
    assert slot == utc(2026, 5, 1, 10, 0)  # 12:00+02:00
    assert slot.tzinfo is UTC


def test_first_slot_once_without_run_at_is_rejected():
    with pytest.raises(InvalidScheduleSpec):
        first_slot(Recurrence(kind=ONCE), now=utc(2026, 4, 1))


def test_first_slot_interval_is_now_without_start_at():
    now = utc(2026, 1, 5, 10, 7, 13)
    assert first_slot(every(600), now=now) == now


def test_first_slot_interval_is_start_at_when_given():
    start_at = utc(2026, 2, 1, 0, 0)
    assert first_slot(every(600), now=utc(2026, 1, 5, 10, 7), start_at=start_at) == start_at


@pytest.mark.parametrize("seconds", [None, 0, -5])
def test_interval_needs_positive_seconds(seconds):
    with pytest.raises(InvalidInterval):
        first_slot(Recurrence(kind=INTERVAL, interval_seconds=seconds), now=utc(2026, 1, 1))


def test_first_slot_cron_at_a_match_is_that_instant():
    assert first_slot(cron("0 10 * * *"), now=utc(2026, 1, 5, 10, 0)) == utc(2026, 1, 5, 10, 0)


def test_first_slot_cron_just_after_a_match_is_the_next_one():
    assert first_slot(cron("0 10 * * *"), now=utc(2026, 1, 5, 10, 0, 0, 1)) == utc(2026, 1, 6, 10, 0)
    assert first_slot(cron("*/5 * * * *"), now=utc(2026, 1, 5, 10, 2, 30)) == utc(2026, 1, 5, 10, 5)


def test_first_slot_cron_uses_the_schedule_zone_and_start_at():
    # 09:00 CEST on 2026-07-01 is 07:00 UTC.
    rec = cron("0 9 * * *", "Europe/Paris")
    assert first_slot(rec, now=utc(2026, 6, 1), start_at=utc(2026, 7, 1, 0, 0)) == utc(2026, 7, 1, 7, 0)
    # 12:00 UTC is 07:00 EST; the next 09:00 EST is 14:00 UTC the same day.
    assert first_slot(cron("0 9 * * *", "America/New_York"), now=utc(2026, 1, 5, 12, 0)) == utc(2026, 1, 5, 14, 0)


def test_unknown_kind_is_rejected():
    with pytest.raises(InvalidScheduleSpec):
        first_slot(Recurrence(kind="weekly"), now=utc(2026, 1, 1))


def test_naive_datetimes_are_refused():
    with pytest.raises(ValueError, match="timezone-aware"):
        first_slot(every(60), now=datetime(2026, 1, 1))


# --- next_slot_after / upcoming --------------------------------------------------------------


def test_interval_next_is_computed_from_the_slot_without_drift():
    # Each slot is the previous one plus 3600 s, whatever the tick's lateness.
    assert chain_after(every(3600), utc(2026, 1, 1, 10, 0), 3) == [
        utc(2026, 1, 1, 11, 0),
        utc(2026, 1, 1, 12, 0),
        utc(2026, 1, 1, 13, 0),
    ]


def test_interval_ignores_dst():
    # Europe/Paris springs forward at 01:00 UTC on 2026-03-29; an interval does not care.
    rec = Recurrence(kind=INTERVAL, interval_seconds=3600, timezone="Europe/Paris")
    assert next_slot_after(rec, utc(2026, 3, 29, 0, 30)) == utc(2026, 3, 29, 1, 30)


def test_once_has_no_next_slot():
    rec = Recurrence(kind=ONCE, run_at=utc(2026, 1, 1))
    assert next_slot_after(rec, utc(2026, 1, 1)) is None


def test_cron_next_is_strictly_after():
    rec = cron("*/5 * * * *")
    assert next_slot_after(rec, utc(2026, 1, 1, 12, 0)) == utc(2026, 1, 1, 12, 5)
    assert next_slot_after(rec, utc(2026, 1, 1, 12, 2, 30)) == utc(2026, 1, 1, 12, 5)


def test_cron_next_returns_utc():
    slot = next_slot_after(cron("0 9 * * *", "Europe/Paris"), utc(2026, 1, 1))
    assert slot == utc(2026, 1, 1, 8, 0)  # 09:00 CET
    assert slot.tzinfo is UTC


class _CountingCroniter(croniter):
    steps = 0

    def get_next(self, *args, **kwargs):
        type(self).steps += 1
        return super().get_next(*args, **kwargs)


@pytest.mark.parametrize("tz", ["UTC", "Europe/Paris"])
@pytest.mark.parametrize("after", [utc(2026, 6, 10, 12, 0), utc(2026, 6, 10, 12, 2, 30)])
def test_plain_cron_next_costs_one_or_two_croniter_steps(monkeypatch, tz, after):
    monkeypatch.setattr(_CountingCroniter, "steps", 0)
    monkeypatch.setattr(recurrence, "croniter", _CountingCroniter)
    assert next_slot_after(cron("*/5 * * * *", tz), after) == utc(2026, 6, 10, 12, 5)
    assert 1 <= _CountingCroniter.steps <= 2


def test_upcoming_interval():
    assert upcoming(every(600), utc(2026, 1, 1, 10, 0)) == [
        utc(2026, 1, 1, 10, 0),
        utc(2026, 1, 1, 10, 10),
        utc(2026, 1, 1, 10, 20),
        utc(2026, 1, 1, 10, 30),
        utc(2026, 1, 1, 10, 40),
    ]


def test_upcoming_cron_weekdays():
    # 2026-01-09 is a Friday; the next weekdays are Monday 12th and Tuesday 13th.
    assert upcoming(cron("0 9 * * MON-FRI"), utc(2026, 1, 9, 9, 0), count=3) == [
        utc(2026, 1, 9, 9, 0),
        utc(2026, 1, 12, 9, 0),
        utc(2026, 1, 13, 9, 0),
    ]


def test_upcoming_once_and_edge_cases():
    run_at = utc(2026, 1, 1, 10, 0)
    assert upcoming(Recurrence(kind=ONCE, run_at=run_at), run_at) == [run_at]
    assert upcoming(Recurrence(kind=ONCE, run_at=run_at), None) == []
    assert upcoming(every(60), utc(2026, 1, 1), count=0) == []


def test_upcoming_across_spring_forward():
    # New York, 2026-03-08: 02:30 does not exist and fires at 03:00 EDT (07:00 UTC).
    assert upcoming(cron("30 2 * * *", "America/New_York"), utc(2026, 3, 7, 7, 30), count=3) == [
        utc(2026, 3, 7, 7, 30),  # 02:30 EST
        utc(2026, 3, 8, 7, 0),  # 03:00 EDT, first instant after the gap
        utc(2026, 3, 9, 6, 30),  # 02:30 EDT
    ]


# --- catch-up: interval ----------------------------------------------------------------------

TEN_MIN = every(600)


def test_catch_up_not_due_changes_nothing():
    for policy in ("one", "all", "skip"):
        assert plan(TEN_MIN, next_run_at=utc(2026, 1, 1, 10, 0), now=utc(2026, 1, 1, 9, 59), policy=policy) == (
            CatchUpPlan(slots=(), dropped=0, next_run_at=utc(2026, 1, 1, 10, 0))
        )


def test_catch_up_on_time_creates_the_slot():
    for policy in ("one", "all", "skip"):
        assert plan(TEN_MIN, next_run_at=utc(2026, 1, 1, 10, 0), now=utc(2026, 1, 1, 10, 0), policy=policy) == (
            CatchUpPlan(slots=(utc(2026, 1, 1, 10, 0),), dropped=0, next_run_at=utc(2026, 1, 1, 10, 10))
        )


# Missed: 10:00, 10:10, 10:20, 10:30, 10:40, 10:50, 11:00 (7 slots) when the tick runs at 11:05.
OUTAGE = {"next_run_at": utc(2026, 1, 1, 10, 0), "now": utc(2026, 1, 1, 11, 5)}


def test_interval_catch_up_one():
    assert plan(TEN_MIN, policy="one", **OUTAGE) == CatchUpPlan(
        slots=(utc(2026, 1, 1, 11, 0),), dropped=6, next_run_at=utc(2026, 1, 1, 11, 10)
    )


def test_interval_catch_up_all_under_the_cap():
    result = plan(TEN_MIN, policy="all", **OUTAGE)
    assert result.slots == tuple(utc(2026, 1, 1, 10, 0) + timedelta(minutes=10 * k) for k in range(7))
    assert result.dropped == 0
    assert result.next_run_at == utc(2026, 1, 1, 11, 10)


def test_interval_catch_up_all_over_the_cap_keeps_the_most_recent():
    assert plan(TEN_MIN, policy="all", max_catch_up=3, **OUTAGE) == CatchUpPlan(
        slots=(utc(2026, 1, 1, 10, 40), utc(2026, 1, 1, 10, 50), utc(2026, 1, 1, 11, 0)),
        dropped=4,
        next_run_at=utc(2026, 1, 1, 11, 10),
    )


def test_interval_catch_up_skip_after_an_outage_runs_nothing():
    # 11:00 is 5 minutes old: beyond the 60 s grace.
    assert plan(TEN_MIN, policy="skip", grace=60, **OUTAGE) == CatchUpPlan(
        slots=(), dropped=7, next_run_at=utc(2026, 1, 1, 11, 10)
    )


def test_interval_catch_up_skip_keeps_slots_within_grace():
    # Grace 400 s: 11:00 (300 s old) is in, 10:50 (900 s old) is out.
    assert plan(TEN_MIN, policy="skip", grace=400, **OUTAGE) == CatchUpPlan(
        slots=(utc(2026, 1, 1, 11, 0),), dropped=6, next_run_at=utc(2026, 1, 1, 11, 10)
    )


def test_interval_catch_up_skip_normal_ticking_loses_nothing():
    # A tick 30 s late, then one exactly at the grace limit (inclusive).
    assert plan(TEN_MIN, next_run_at=utc(2026, 1, 1, 10, 0), now=utc(2026, 1, 1, 10, 0, 30), policy="skip").slots == (
        utc(2026, 1, 1, 10, 0),
    )
    assert plan(TEN_MIN, next_run_at=utc(2026, 1, 1, 10, 0), now=utc(2026, 1, 1, 10, 1), policy="skip").slots == (
        utc(2026, 1, 1, 10, 0),
    )


def test_one_second_interval_after_a_week_outage_is_arithmetic():
    # Slots 00:00:00 .. 7 days later inclusive: 7*86400 + 1 = 604801 of them.
    rec = every(1)
    start, now = utc(2026, 1, 1), utc(2026, 1, 8)
    began = time.perf_counter()
    one = plan(rec, next_run_at=start, now=now, policy="one")
    everything = plan(rec, next_run_at=start, now=now, policy="all", max_catch_up=100)
    skip = plan(rec, next_run_at=start, now=now, policy="skip", grace=60)
    assert time.perf_counter() - began < 0.5

    assert one == CatchUpPlan(slots=(now,), dropped=604800, next_run_at=utc(2026, 1, 8, 0, 0, 1))
    assert len(everything.slots) == 100
    assert everything.slots[0] == utc(2026, 1, 7, 23, 58, 21)  # now - 99 s
    assert everything.slots[-1] == now
    assert everything.dropped == 604701
    assert everything.next_run_at == utc(2026, 1, 8, 0, 0, 1)
    # Within 60 s grace: now-60 s .. now, 61 slots.
    assert skip.slots[0] == utc(2026, 1, 7, 23, 59, 0)
    assert skip.slots[-1] == now
    assert len(skip.slots) == 61
    assert skip.dropped == 604740


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="catch-up policy"):
        plan(TEN_MIN, policy="some", **OUTAGE)


# --- catch-up: once --------------------------------------------------------------------------

ONCE_REC = Recurrence(kind=ONCE, run_at=utc(2026, 1, 1, 10, 0))


def test_once_overdue_runs_once_then_never():
    for policy in ("one", "all"):
        assert plan(ONCE_REC, next_run_at=utc(2026, 1, 1, 10, 0), now=utc(2026, 1, 1, 12, 0), policy=policy) == (
            CatchUpPlan(slots=(utc(2026, 1, 1, 10, 0),), dropped=0, next_run_at=None)
        )


def test_once_overdue_with_skip():
    assert plan(ONCE_REC, next_run_at=utc(2026, 1, 1, 10, 0), now=utc(2026, 1, 1, 12, 0), policy="skip") == (
        CatchUpPlan(slots=(), dropped=1, next_run_at=None)
    )
    assert plan(ONCE_REC, next_run_at=utc(2026, 1, 1, 10, 0), now=utc(2026, 1, 1, 10, 0, 30), policy="skip") == (
        CatchUpPlan(slots=(utc(2026, 1, 1, 10, 0),), dropped=0, next_run_at=None)
    )


def test_once_not_yet_due():
    assert plan(ONCE_REC, next_run_at=utc(2026, 1, 1, 10, 0), now=utc(2026, 1, 1, 9, 0), policy="one") == (
        CatchUpPlan(slots=(), dropped=0, next_run_at=utc(2026, 1, 1, 10, 0))
    )


# --- catch-up: cron --------------------------------------------------------------------------

HOURLY = cron("0 * * * *")
# Missed: 10:00, 11:00, 12:00, 13:00 when the tick runs at 13:30.
CRON_OUTAGE = {"next_run_at": utc(2026, 1, 1, 10, 0), "now": utc(2026, 1, 1, 13, 30)}


def test_cron_catch_up_one():
    assert plan(HOURLY, policy="one", **CRON_OUTAGE) == CatchUpPlan(
        slots=(utc(2026, 1, 1, 13, 0),), dropped=3, next_run_at=utc(2026, 1, 1, 14, 0)
    )


def test_cron_catch_up_all():
    assert plan(HOURLY, policy="all", **CRON_OUTAGE) == CatchUpPlan(
        slots=(utc(2026, 1, 1, 10, 0), utc(2026, 1, 1, 11, 0), utc(2026, 1, 1, 12, 0), utc(2026, 1, 1, 13, 0)),
        dropped=0,
        next_run_at=utc(2026, 1, 1, 14, 0),
    )
    assert plan(HOURLY, policy="all", max_catch_up=2, **CRON_OUTAGE) == CatchUpPlan(
        slots=(utc(2026, 1, 1, 12, 0), utc(2026, 1, 1, 13, 0)), dropped=2, next_run_at=utc(2026, 1, 1, 14, 0)
    )


def test_cron_catch_up_skip():
    # 13:00 is 30 min old at 13:30: beyond grace.
    assert plan(HOURLY, policy="skip", **CRON_OUTAGE) == CatchUpPlan(
        slots=(), dropped=4, next_run_at=utc(2026, 1, 1, 14, 0)
    )
    # At 13:00:45 it is 45 s old: within grace.
    assert plan(HOURLY, policy="skip", next_run_at=utc(2026, 1, 1, 10, 0), now=utc(2026, 1, 1, 13, 0, 45)) == (
        CatchUpPlan(slots=(utc(2026, 1, 1, 13, 0),), dropped=3, next_run_at=utc(2026, 1, 1, 14, 0))
    )


def test_cron_catch_up_all_over_the_cap():
    # Every 5 min for a day: 00:00 .. next 00:00 inclusive = 24*12 + 1 = 289 slots.
    # The last 100 start at 24:00 - 99*5 min = 15:45.
    result = plan(cron("*/5 * * * *"), next_run_at=utc(2026, 1, 1), now=utc(2026, 1, 2), policy="all")
    assert len(result.slots) == 100
    assert result.slots[0] == utc(2026, 1, 1, 15, 45)
    assert result.slots[-1] == utc(2026, 1, 2, 0, 0)
    assert all(b - a == timedelta(minutes=5) for a, b in zip(result.slots, result.slots[1:], strict=False))
    assert result.dropped == 189
    assert result.next_run_at == utc(2026, 1, 2, 0, 5)


def test_cron_catch_up_after_a_week_stays_bounded_and_keeps_the_right_slots():
    # Every minute for a week: 7*1440 + 1 = 10081 slots. The chosen slots are exact;
    # past the counting budget `dropped` is only a lower bound.
    rec = cron("* * * * *", "Europe/Paris")
    start, now = utc(2026, 6, 1), utc(2026, 6, 8, 0, 0, 30)
    began = time.perf_counter()
    one = plan(rec, next_run_at=start, now=now, policy="one")
    skip = plan(rec, next_run_at=start, now=now, policy="skip")
    everything = plan(rec, next_run_at=start, now=now, policy="all", max_catch_up=100)
    assert time.perf_counter() - began < 5

    assert one.slots == (utc(2026, 6, 8, 0, 0),)
    assert one.next_run_at == utc(2026, 6, 8, 0, 1)
    assert 1000 <= one.dropped <= 10080
    assert skip.slots == (utc(2026, 6, 8, 0, 0),)  # 30 s old; 23:59 is 90 s old
    assert skip.next_run_at == utc(2026, 6, 8, 0, 1)
    assert 1000 <= skip.dropped <= 10080
    assert everything.slots[0] == utc(2026, 6, 7, 22, 21)  # 00:00 - 99 min
    assert everything.slots[-1] == utc(2026, 6, 8, 0, 0)
    assert len(everything.slots) == 100
    assert 9900 <= everything.dropped <= 9981


def test_cron_catch_up_across_fall_back_keeps_both_hourly_runs():
    # New York 2026-11-01, hourly: 00:00 EDT, 01:00 EDT, 01:00 EST, 02:00 EST.
    result = plan(
        cron("0 * * * *", "America/New_York"),
        next_run_at=utc(2026, 11, 1, 4, 0),
        now=utc(2026, 11, 1, 7, 30),
        policy="all",
    )
    assert result.slots == (
        utc(2026, 11, 1, 4, 0),  # 00:00 EDT
        utc(2026, 11, 1, 5, 0),  # 01:00 EDT
        utc(2026, 11, 1, 6, 0),  # 01:00 EST
        utc(2026, 11, 1, 7, 0),  # 02:00 EST
    )
    assert result.next_run_at == utc(2026, 11, 1, 8, 0)  # 03:00 EST


# --- DST: Europe/Paris -----------------------------------------------------------------------


def test_paris_spring_forward_fixed_hour():
    rec = cron("30 2 * * *", "Europe/Paris")
    assert chain_after(rec, utc(2026, 3, 27, 12, 0), 3) == [
        utc(2026, 3, 28, 1, 30),  # 02:30 CET
        utc(2026, 3, 29, 1, 0),  # 02:30 does not exist: 03:00 CEST, the end of the gap
        utc(2026, 3, 30, 0, 30),  # 02:30 CEST
    ]


def test_paris_spring_forward_hourly_merges_the_gap_into_one_slot():
    rec = cron("0 * * * *", "Europe/Paris")
    assert chain_after(rec, utc(2026, 3, 28, 23, 30), 3) == [
        utc(2026, 3, 29, 0, 0),  # 01:00 CET
        utc(2026, 3, 29, 1, 0),  # 02:00 (gap) and 03:00 CEST: one slot
        utc(2026, 3, 29, 2, 0),  # 04:00 CEST
    ]


def test_paris_spring_forward_every_15_minutes():
    rec = cron("*/15 * * * *", "Europe/Paris")
    assert chain_after(rec, utc(2026, 3, 29, 0, 40), 3) == [
        utc(2026, 3, 29, 0, 45),  # 01:45 CET
        utc(2026, 3, 29, 1, 0),  # 02:00, 02:15, 02:30, 02:45 (gap) and 03:00 CEST: one slot
        utc(2026, 3, 29, 1, 15),  # 03:15 CEST
    ]


def test_paris_fall_back_fixed_hour_fires_at_the_first_occurrence():
    rec = cron("30 2 * * *", "Europe/Paris")
    assert chain_after(rec, utc(2026, 10, 24, 12, 0), 2) == [
        utc(2026, 10, 25, 0, 30),  # 02:30 CEST; not again at 02:30 CET (01:30 UTC)
        utc(2026, 10, 26, 1, 30),  # 02:30 CET
    ]


def test_paris_fall_back_hourly_fires_at_both_occurrences():
    rec = cron("0 * * * *", "Europe/Paris")
    assert chain_after(rec, utc(2026, 10, 24, 23, 30), 3) == [
        utc(2026, 10, 25, 0, 0),  # 02:00 CEST
        utc(2026, 10, 25, 1, 0),  # 02:00 CET
        utc(2026, 10, 25, 2, 0),  # 03:00 CET
    ]


# --- DST: America/New_York -------------------------------------------------------------------


def test_new_york_spring_forward_fixed_hour():
    rec = cron("30 2 * * *", "America/New_York")
    assert chain_after(rec, utc(2026, 3, 7, 0, 0), 3) == [
        utc(2026, 3, 7, 7, 30),  # 02:30 EST
        utc(2026, 3, 8, 7, 0),  # 02:30 does not exist: 03:00 EDT
        utc(2026, 3, 9, 6, 30),  # 02:30 EDT
    ]


def test_new_york_spring_forward_hourly():
    rec = cron("0 * * * *", "America/New_York")
    assert chain_after(rec, utc(2026, 3, 8, 5, 30), 3) == [
        utc(2026, 3, 8, 6, 0),  # 01:00 EST
        utc(2026, 3, 8, 7, 0),  # 02:00 (gap) merged with 03:00 EDT
        utc(2026, 3, 8, 8, 0),  # 04:00 EDT
    ]


def test_new_york_fall_back_fixed_hour_fires_once():
    rec = cron("30 1 * * *", "America/New_York")
    assert chain_after(rec, utc(2026, 10, 31, 12, 0), 2) == [
        utc(2026, 11, 1, 5, 30),  # 01:30 EDT; not again at 01:30 EST (06:30 UTC)
        utc(2026, 11, 2, 6, 30),  # 01:30 EST
    ]


def test_new_york_fall_back_fixed_hour_range():
    # `0 1-3`: 01:00 EDT, then 02:00 and 03:00 EST; 01:00 EST is the repeat and does not fire.
    rec = cron("0 1-3 * * *", "America/New_York")
    assert chain_after(rec, utc(2026, 11, 1, 4, 30), 3) == [
        utc(2026, 11, 1, 5, 0),
        utc(2026, 11, 1, 7, 0),
        utc(2026, 11, 1, 8, 0),
    ]


def test_new_york_fall_back_hourly_fires_at_both_occurrences():
    rec = cron("0 * * * *", "America/New_York")
    assert chain_after(rec, utc(2026, 11, 1, 3, 30), 4) == [
        utc(2026, 11, 1, 4, 0),  # 00:00 EDT
        utc(2026, 11, 1, 5, 0),  # 01:00 EDT
        utc(2026, 11, 1, 6, 0),  # 01:00 EST
        utc(2026, 11, 1, 7, 0),  # 02:00 EST
    ]


def test_new_york_fall_back_every_15_minutes_in_real_time_order():
    rec = cron("*/15 * * * *", "America/New_York")
    assert chain_after(rec, utc(2026, 11, 1, 4, 50), 9) == [
        utc(2026, 11, 1, 5, 0),  # 01:00 EDT
        utc(2026, 11, 1, 5, 15),  # 01:15 EDT
        utc(2026, 11, 1, 5, 30),  # 01:30 EDT
        utc(2026, 11, 1, 5, 45),  # 01:45 EDT
        utc(2026, 11, 1, 6, 0),  # 01:00 EST
        utc(2026, 11, 1, 6, 15),  # 01:15 EST
        utc(2026, 11, 1, 6, 30),  # 01:30 EST
        utc(2026, 11, 1, 6, 45),  # 01:45 EST
        utc(2026, 11, 1, 7, 0),  # 02:00 EST
    ]


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        (utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 5, 45)),  # after 01:30 EDT: 01:45 EDT
        (utc(2026, 11, 1, 5, 45), utc(2026, 11, 1, 6, 0)),  # after 01:45 EDT: 01:00 EST
        (utc(2026, 11, 1, 6, 10), utc(2026, 11, 1, 6, 15)),  # after 01:10 EST: 01:15 EST
        (utc(2026, 11, 1, 6, 45), utc(2026, 11, 1, 7, 0)),  # after 01:45 EST: 02:00 EST
    ],
)
def test_next_slot_from_inside_the_repeated_hour(after, expected):
    assert next_slot_after(cron("*/15 * * * *", "America/New_York"), after) == expected


def test_first_slot_created_inside_the_repeated_hour():
    now = utc(2026, 11, 1, 6, 10)  # 01:10 EST, the second pass through 01:xx
    assert first_slot(cron("*/15 * * * *", "America/New_York"), now=now) == utc(2026, 11, 1, 6, 15)
    # 01:30 already fired at its first occurrence (05:30 UTC): next is tomorrow 01:30 EST.
    assert first_slot(cron("30 1 * * *", "America/New_York"), now=now) == utc(2026, 11, 2, 6, 30)


@pytest.mark.parametrize(
    ("tz", "around"),
    [("America/New_York", utc(2026, 11, 1, 6, 0)), ("Europe/Paris", utc(2026, 3, 29, 1, 0))],
)
@pytest.mark.parametrize("expr", ["*/15 * * * *", "0 * * * *", "30 1 * * *", "*/20 1-3 * * *"])
def test_next_slot_is_consistent_from_any_instant_near_a_transition(tz, around, expr):
    # Property: from any instant p, next_slot_after(p) is the first slot of the chain after p,
    # and first_slot(now=p) the first at or after p; the chain itself strictly increases.
    rec = cron(expr, tz)
    begin = around - timedelta(hours=4)
    slots = chain_after(rec, begin, 12)
    assert all(a < b for a, b in itertools.pairwise(slots))
    p = begin + timedelta(seconds=1)  # `begin` may itself be a slot, not in `slots`
    while p < slots[-1]:
        assert next_slot_after(rec, p) == next(s for s in slots if s > p)
        assert first_slot(rec, now=p) == next(s for s in slots if s >= p)
        p += timedelta(minutes=7, seconds=30)
