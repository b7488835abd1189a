"""The strict cron dialect, checked against an independent brute-force oracle.

The oracle below has its own field parser and its own day rule and DST
handling, written from docs/reference/cron.md and the ``recurrence`` module docstring; it
uses no croniter and no distsched code, and finds the UTC instants of a wall
time only by converting candidate instants forward (UTC -> local). It
enumerates, for every local day in 2026-2028, the candidate times of the
expression, and the fire times of ``recurrence`` must equal its list exactly,
in UTC and in three zones with daylight saving time in both hemispheres
(plus Lord Howe, whose clock moves by 30 minutes).
"""

from __future__ import annotations

import random
import zoneinfo
from bisect import bisect_left, bisect_right
from datetime import UTC, date, datetime, timedelta
from functools import cache
from itertools import takewhile

import pytest

from distsched_app import cron
from distsched_app.errors import InvalidCron
from distsched_app.recurrence import (
    CRON,
    Recurrence,
    first_slot,
    next_slot_after,
    plan_catch_up,
    upcoming,
    validate_cron,
)

START = datetime(2026, 1, 1, tzinfo=UTC)
END = datetime(2029, 1, 1, tzinfo=UTC)  # three years, 2028 a leap year
ZONES = ["UTC", "Europe/Paris", "America/New_York", "Australia/Sydney", "Australia/Lord_Howe"]
# Frequent expressions are limited to Sundays of the months where the clocks
# change (always on a Sunday in these zones) to keep the test fast.
DST_MONTHS = "MAR,APR,OCT,NOV"
EXPRESSIONS = [
    f"0 * * {DST_MONTHS} SUN",  # wildcard hour: both occurrences of a repeated hour
    f"*/20 0-4 * {DST_MONTHS} SUN",  # minute step, fixed hours: first occurrence only
    f"*/20 0-4/1 * {DST_MONTHS} SUN",  # a step in the hour counts as a wildcard
    f"*/10 2 * {DST_MONTHS} 0",  # every 10 minutes of the hour that is skipped or repeated
    "*/30 1-3 * 3,4,10,11 7",  # weekday 7 is Sunday too
    f"30 1 * {DST_MONTHS} SUN",  # New York and Lord Howe repeat 01:30
    "0,30 2 * * 0",
    f"30 2 * {DST_MONTHS} *",  # fixed hour, every day
    "0 9,17 * SEP MON",  # hour list
    f"0 1-3 * {DST_MONTHS} SUN",  # fixed hour range
    "45 */6 * 1,7 WED",  # hour step
    "0 9 * 1-3 MON-FRI",  # name range
    "0 9 * * 7",
    "0 12 1,15 * *",  # day of month only
    "0 12 * AUG sat,Sun",  # day of week only, names in any case
    "0 9 1-7 * MON",  # both restricted: either matches
    "0 9 */2 * MON",  # day of month starts with '*': both must match
    "0 9 1-7 * */2",  # day of week starts with '*': both must match
    "0 0 1-31/10 5-8 1-5",  # range step OR weekday range
    "5 4 * 6 1-7/2",  # weekday range step: Mon, Wed, Fri, Sun
    "0 0 * 2 */3",  # February Sundays, Wednesdays and Saturdays
    "0 6 30 2 MON",  # no 30 February, but February Mondays (OR)
    "0 0 29 2 *",  # leap day
    "0 0 31 * *",
    "0 8 * JAN,jul *",  # month names
    "0 22 * 12 5-7",  # Friday to Sunday
    "59 23 31 12 *",
    "0 0 1 */3 *",  # month step
    "0 0 1-31 FEB MON",  # both restricted, day of month full: every day
]

# --- the oracle --------------------------------------------------------------------------------

MONTHS = {n: i + 1 for i, n in enumerate("JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split())}
WEEKDAYS = {n: i for i, n in enumerate("SUN MON TUE WED THU FRI SAT".split())}
BOUNDS = [(0, 59, {}), (0, 23, {}), (1, 31, {}), (1, 12, MONTHS), (0, 7, WEEKDAYS)]


def oracle_field(text: str, low: int, high: int, names: dict[str, int]) -> set[int]:
    def value(token: str) -> int:
        return names[token.upper()] if token.upper() in names else int(token)

    out: set[int] = set()
    for part in text.split(","):
        span, _, step = part.partition("/")
        if span == "*":
            first, last = low, high
        elif "-" in span:
            first, last = map(value, span.split("-"))
        else:
            first = last = value(span)
        out.update(range(first, last + 1, int(step or 1)))
    return out


def wall_of(instant: datetime, zone: zoneinfo.ZoneInfo) -> datetime:
    return instant.astimezone(zone).replace(tzinfo=None)


def instants_of(wall: datetime, zone: zoneinfo.ZoneInfo, both: bool) -> list[datetime]:
    """The UTC instants at which the zone's clock shows ``wall``, under the DST rules."""
    offsets = {(wall + timedelta(days=k)).replace(tzinfo=UTC).astimezone(zone).utcoffset() for k in (-2, 2)}
    hits = sorted(u for off in offsets if wall_of(u := wall.replace(tzinfo=UTC) - off, zone) == wall)
    if not hits:
        # In a spring-forward gap: the first instant whose clock reads later than `wall`.
        u = wall.replace(tzinfo=UTC) - max(offsets)
        while wall_of(u, zone) < wall:
            u += timedelta(minutes=1)
        return [u]
    return hits if both else hits[:1]


@cache
def oracle(expr: str, tz: str) -> list[datetime]:
    fields = expr.split()
    minutes, hours, doms, months, dows = (oracle_field(f, *b) for f, b in zip(fields, BOUNDS, strict=True))
    dows = {d % 7 for d in dows}
    star = fields[2].startswith("*") or fields[4].startswith("*")
    both = "*" in fields[1] or "/" in fields[1]
    zone = zoneinfo.ZoneInfo(tz)
    out: set[datetime] = set()
    day = date(2025, 12, 30)
    while day < date(2029, 1, 3):
        dom_ok, dow_ok = day.day in doms, day.isoweekday() % 7 in dows
        if day.month in months and ((dom_ok and dow_ok) if star else (dom_ok or dow_ok)):
            for h in hours:
                for m in minutes:
                    out.update(instants_of(datetime(day.year, day.month, day.day, h, m), zone, both))
        day += timedelta(days=1)
    return sorted(u for u in out if START <= u < END)


@cache
def transitions(tz: str) -> list[datetime]:
    """The instants in [START, END) at which the zone's UTC offset changes."""
    zone = zoneinfo.ZoneInfo(tz)
    found, u = [], START
    while u < END:
        nxt = u + timedelta(hours=1)
        if u.astimezone(zone).utcoffset() != nxt.astimezone(zone).utcoffset():
            t = u
            while t.astimezone(zone).utcoffset() == u.astimezone(zone).utcoffset():
                t += timedelta(minutes=1)
            found.append(t)
        u = nxt
    return found


def test_oracle_knows_the_zones_transitions():
    # Two a year in each zone with DST (a sanity check of the oracle itself).
    assert transitions("UTC") == []
    assert transitions("Europe/Paris")[:2] == [
        datetime(2026, 3, 29, 1, tzinfo=UTC),
        datetime(2026, 10, 25, 1, tzinfo=UTC),
    ]
    for tz in ZONES[1:]:
        assert len(transitions(tz)) == 6


def test_oracle_applies_the_documented_dst_rules():
    # The examples of the recurrence docstring, Europe/Paris 2026-03-29 and New York 2026-11-01.
    gap = [
        u
        for u in oracle(f"*/20 0-4 * {DST_MONTHS} SUN", "Europe/Paris")
        if datetime(2026, 3, 29, 0, 30, tzinfo=UTC) <= u <= datetime(2026, 3, 29, 1, 30, tzinfo=UTC)
    ]
    # 01:40 CET, then 02:00/02:20/02:40 (gap) and 03:00 CEST as one slot, then 03:20 CEST.
    assert gap == [
        datetime(2026, 3, 29, 0, 40, tzinfo=UTC),
        datetime(2026, 3, 29, 1, 0, tzinfo=UTC),
        datetime(2026, 3, 29, 1, 20, tzinfo=UTC),
    ]
    hourly = [
        u
        for u in oracle(f"0 * * {DST_MONTHS} SUN", "America/New_York")
        if datetime(2026, 11, 1, 4, tzinfo=UTC) <= u <= datetime(2026, 11, 1, 7, tzinfo=UTC)
    ]
    assert hourly == [datetime(2026, 11, 1, h, tzinfo=UTC) for h in (4, 5, 6, 7)]  # 01:00 twice
    fixed = [u for u in oracle(f"30 1 * {DST_MONTHS} SUN", "America/New_York") if u.date() == date(2026, 11, 1)]
    assert fixed == [datetime(2026, 11, 1, 5, 30, tzinfo=UTC)]  # 01:30 EDT only


# --- recurrence against the oracle ---------------------------------------------------------------


def rec(expr: str, tz: str) -> Recurrence:
    return Recurrence(kind=CRON, cron=expr, timezone=tz)


@pytest.mark.parametrize("tz", ZONES)
@pytest.mark.parametrize("expr", EXPRESSIONS)
def test_fire_times_match_the_oracle(expr, tz):
    expected = oracle(expr, tz)
    assert expected, "every expression in the set fires within the three years"
    r = rec(expr, tz)
    first = first_slot(r, now=START)
    assert first == expected[0]
    # The whole walk, through upcoming (the slot iterator behind every other function).
    walked = list(takewhile(lambda s: s < END, upcoming(r, first, count=len(expected) + 1)))
    assert walked == expected

    # Single steps from instants near every transition, from slots, and from random instants.
    rng = random.Random(f"{expr}|{tz}")
    probes = [t + timedelta(minutes=d) for t in transitions(tz) for d in (-31, 0, 1)]
    probes += rng.sample(expected, min(4, len(expected)))
    probes += [START + (END - START) * rng.random() for _ in range(4)]
    for p in probes:
        i = bisect_right(expected, p)
        if i < len(expected):
            assert next_slot_after(r, p) == expected[i], p
        j = bisect_left(expected, p)
        if j < len(expected):
            assert first_slot(r, now=p) == expected[j], p


@pytest.mark.parametrize("tz", ZONES[1:])
@pytest.mark.parametrize("expr", [f"0 * * {DST_MONTHS} SUN", f"*/10 2 * {DST_MONTHS} 0", f"30 2 * {DST_MONTHS} *"])
def test_catch_up_across_each_transition_matches_the_oracle(expr, tz):
    expected = oracle(expr, tz)
    r = rec(expr, tz)
    for t in transitions(tz):
        lo, hi = bisect_left(expected, t - timedelta(hours=26)), bisect_right(expected, t + timedelta(hours=3))
        now = t + timedelta(hours=3)
        result = plan_catch_up(
            r, next_run_at=expected[lo], now=now, policy="all", max_catch_up=10_000, misfire_grace_seconds=60
        )
        assert list(result.slots) == expected[lo:hi]
        assert result.next_run_at == expected[hi]


# --- the day rule, by hand -----------------------------------------------------------------------


def day_list(expr: str, count: int) -> list[int]:
    r = rec(expr, "UTC")
    return [s.day for s in upcoming(r, first_slot(r, now=datetime(2026, 1, 1, tzinfo=UTC)), count)]


def test_both_day_fields_restricted_means_either():
    # January 2026 starts on a Thursday: the 1st-7th, then the Mondays 12, 19, 26.
    assert day_list("0 9 1-7 * MON", 10) == [1, 2, 3, 4, 5, 6, 7, 12, 19, 26]


def test_a_day_field_starting_with_star_means_both():
    # Odd-numbered days that are Mondays: 5 and 19 January, 9 and 23 February, 9 and 23 March.
    assert day_list("0 9 */2 * MON", 6) == [5, 19, 9, 23, 9, 23]
    # 1st-7th that are Sunday, Tuesday, Thursday or Saturday: January 1, 3, 4, 6; February 1, 3.
    assert day_list("0 9 1-7 * */2", 6) == [1, 3, 4, 6, 1, 3]


def test_weekday_7_0_and_sun_are_the_same_day():
    assert day_list("0 9 * * 7", 4) == day_list("0 9 * * 0", 4) == day_list("0 9 * * sun", 4) == [4, 11, 18, 25]


def test_a_rare_but_real_date_is_found_decades_ahead():
    # 29 February that is a Sunday (day of week starts with '*': both must match): 2032.
    r = rec("0 12 29 2 */7", "UTC")
    assert first_slot(r, now=START) == datetime(2032, 2, 29, 12, tzinfo=UTC)


@pytest.mark.parametrize(
    ("expr", "wildcard"),
    [
        ("0 * * * *", True),
        ("0 */2 * * *", True),
        ("0 1-5/2 * * *", True),
        ("0 1,*/6 * * *", True),
        ("0 1 * * *", False),
        ("0 1-3 * * *", False),
        ("0 9,17 * * *", False),
    ],
)
def test_hour_wildcard_flag(expr, wildcard):
    assert cron.parse(expr).hour_wildcard is wildcard


# --- what is accepted, and how it is stored --------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "normalised"),
    [
        ("*/15 * * * *", "*/15 * * * *"),
        ("  0   9  * *\tmon-fri ", "0 9 * * MON-FRI"),
        ("0 0 1 jan,Jul *", "0 0 1 JAN,JUL *"),
        ("05 7 * * 7", "05 7 * * 7"),  # numbers stay as written
        ("1-30/2 0-23/6 */2 1-12/3 0-7/2", "1-30/2 0-23/6 */2 1-12/3 0-7/2"),
        ("0 0 * jan-mar 6-7", "0 0 * JAN-MAR 6-7"),
        ("59 23 31 DEC SAT", "59 23 31 DEC SAT"),
        ("0 0 29 2 */7", "0 0 29 2 */7"),  # rare, but it does fire
        ("*/59 */23 */31 */12 */7", "*/59 */23 */31 */12 */7"),  # the largest steps
    ],
)
def test_accepted_expressions_are_normalised(expr, normalised):
    assert validate_cron(expr) == normalised
    assert validate_cron(normalised) == normalised


@pytest.mark.parametrize(
    ("expr", "field", "token"),
    [
        ("0 R * * *", "hour", "R"),  # croniter's random value
        ("R * * * *", "minute", "R"),
        ("H * * * *", "minute", "H"),  # croniter's hash
        ("H(0-29) * * * *", "minute", "H(0-29)"),
        ("0 0 L * *", "day-of-month", "L"),  # Quartz: last day
        ("0 0 * * 5L", "day-of-week", "5L"),
        ("0 0 15W * *", "day-of-month", "15W"),  # Quartz: nearest weekday
        ("0 0 LW * *", "day-of-month", "LW"),
        ("0 0 * * 5#3", "day-of-week", "5#3"),  # Quartz: third Friday
        ("0 0 ? * MON", "day-of-month", "?"),  # Quartz: no specific value
        ("0 0 * * MONDAY", "day-of-week", "MONDAY"),
        ("0 0 * * FOO", "day-of-week", "FOO"),
        ("-5 * * * *", "minute", "-5"),
        ("1-5-7 * * * *", "minute", "1-5-7"),
        ("*/5/2 * * * *", "minute", "*/5/2"),
        ("*-5 * * * *", "minute", "*-5"),
        ("٣ * * * *", "minute", "٣"),  # a digit, but not an ASCII one
        ("0 0 * * 1-FRIDAY", "day-of-week", "1-FRIDAY"),
    ],
)
def test_unrecognised_tokens_are_named_with_their_field(expr, field, token):
    with pytest.raises(InvalidCron) as info:
        validate_cron(expr)
    assert str(info.value) == (
        f"invalid cron expression {expr!r}: {field} field: {token!r} is not a number, name, '*', list, range or step"
    )
    assert info.value.field == "cron"


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("5-1 * * * *", "minute field: range '5-1' is reversed (start > end)"),
        ("0 0 * * FRI-MON", "day-of-week field: range 'FRI-MON' is reversed (start > end)"),
        ("0 0 * * SAT-SUN", "day-of-week field: range 'SAT-SUN' is reversed (start > end)"),
        ("60 * * * *", "minute field: '60' is out of range 0-59"),
        ("0 24 * * *", "hour field: '24' is out of range 0-23"),
        ("0 0 0 * *", "day-of-month field: '0' is out of range 1-31"),
        ("0 0 32 * *", "day-of-month field: '32' is out of range 1-31"),
        ("0 0 * 13 *", "month field: '13' is out of range 1-12"),
        ("0 0 * 0 *", "month field: '0' is out of range 1-12"),
        ("0 0 * * 8", "day-of-week field: '8' is out of range 0-7"),
        ("0 0 * * 1-8", "day-of-week field: '8' in '1-8' is out of range 0-7"),
        ("*/0 * * * *", "minute field: step '0' in '*/0' must be 1 to 59"),
        ("1-30/0 * * * *", "minute field: step '0' in '1-30/0' must be 1 to 59"),
        ("*/60 * * * *", "minute field: step '60' in '*/60' must be 1 to 59"),
        ("5/15 * * * *", "minute field: '5/15' steps from a single value; write a range (5-59/15) or */15"),
        ("0 0 * * MON/2", "day-of-week field: 'MON/2' steps from a single value; write a range (MON-7/2) or */2"),
        ("1,,2 * * * *", "minute field: empty list item in '1,,2'"),
        (",1 * * * *", "minute field: empty list item in ',1'"),
        ("0 9,17, * * *", "hour field: empty list item in '9,17,'"),
        ("0 0 * MON *", "month field: 'MON' is a day-of-week name"),
        ("0 0 * * JAN", "day-of-week field: 'JAN' is a month name"),
        ("0 jan * * *", "hour field: 'jan' is a month name"),
        ("@daily", "macros such as '@daily' are not supported; write the five fields"),
        ("@reboot", "macros such as '@reboot' are not supported; write the five fields"),
        ("", "expected 5 fields (minute hour day-of-month month day-of-week), got 0"),
        ("garbage", "expected 5 fields (minute hour day-of-month month day-of-week), got 1"),
        ("* * * *", "expected 5 fields (minute hour day-of-month month day-of-week), got 4"),
        ("0 * * * * *", "expected 5 fields (minute hour day-of-month month day-of-week), got 6"),  # seconds
        ("0 0 3 * * * 2026", "expected 5 fields (minute hour day-of-month month day-of-week), got 7"),  # year
    ],
)
def test_rejections_name_the_field_and_token(expr, message):
    with pytest.raises(InvalidCron) as info:
        validate_cron(expr)
    assert str(info.value) == f"invalid cron expression {expr!r}: {message}"


@pytest.mark.parametrize(
    ("expr", "days", "months"),
    [
        ("0 0 30 2 *", "30", "2"),
        ("0 0 31 4 *", "31", "4"),
        ("0 0 30,31 FEB *", "30,31", "FEB"),
        ("0 0 31 2,4,6,9,11 *", "31", "2,4,6,9,11"),
        ("0 0 30 2 */2", "30", "2"),
    ],
)
def test_an_expression_that_never_fires_is_rejected(expr, days, months):
    with pytest.raises(InvalidCron) as info:
        validate_cron(expr)
    assert str(info.value) == f"cron expression {expr!r} never matches: no month in {months!r} has day {days!r}"


def test_long_expressions_are_rejected_and_quoted_short():
    with pytest.raises(InvalidCron) as info:
        validate_cron(",".join(["0"] * 120) + " * * * *")
    assert "longer than 200 characters" in str(info.value)
    with pytest.raises(InvalidCron) as info:
        validate_cron("* " * 5000)
    assert len(str(info.value)) < 200


@pytest.mark.parametrize("value", [None, 5, b"* * * * *", ["*"] * 5])
def test_a_non_string_is_rejected(value):
    with pytest.raises(InvalidCron, match="must be a string"):
        validate_cron(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("expr", ["0 R * * *", "0 0 L * *", "H * * * *", "0 0 30 2 *"])
def test_a_stored_expression_the_dialect_refuses_raises_invalid_cron_when_evaluated(expr):
    # A row written before the strict dialect (or by SQL): the evaluator refuses it too.
    r = rec(expr, "UTC")
    with pytest.raises(InvalidCron):
        first_slot(r, now=START)
    with pytest.raises(InvalidCron):
        next_slot_after(r, START)
    with pytest.raises(InvalidCron):
        upcoming(r, START)
