"""The cron dialect: standard five fields, parsed strictly.

``minute hour day-of-month month day-of-week``, each field a comma-separated
list of items; an item is ``*``, a number or name, a range ``a-b``, or a step
``*/n`` / ``a-b/n``. Names are the English three-letter abbreviations, in any
case: ``JAN``-``DEC`` in the month field, ``SUN``-``SAT`` in the day-of-week
field (also in ranges: ``MON-FRI``). Day-of-week ``0`` and ``7`` are both
Sunday (Vixie cron). A step is 1 to the field's largest value and needs ``*``
or a range before it: classic cron has no ``5/15``.

Everything else is refused with ``InvalidCron`` naming the field and the
token: croniter's and Quartz's extensions (``R``, ``H``, ``L``, ``W``, ``#``,
``?``), ``@daily``-style macros, seconds or year fields, reversed ranges,
values out of range, step 0, empty list items. An expression that can never
fire (``0 0 30 2 *``) is refused too, rather than stalling later.

Day of month and day of week follow Vixie cron: when both fields are
restricted, a day matching *either* fires (``0 9 1-7 * MON``: the 1st to the
7th, and every Monday); a field that starts with ``*`` (``*``, ``*/2``)
restricts nothing beyond itself, so the day must match both
(``0 9 */2 * MON``: odd-numbered days that are Mondays).

Pure: no clock, no time zones (``recurrence`` maps matches to instants). The
parsed sets are handed to croniter, which walks the matches, only as plain
number lists with ``day_or`` chosen here, so none of its dialect leaks in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property, lru_cache

from .errors import InvalidCron

# The Schedule.cron column's max_length: longer text could not be stored.
MAX_LENGTH = 200
MONTH_NAMES = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
DAY_NAMES = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
# Longest month, leap years included: what "never fires" is checked against.
_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_NUMBER = re.compile(r"[0-9]+")  # ASCII only: str.isdigit() also accepts "٣"
_WORD = re.compile(r"[A-Za-z]+")
_SHOWN = 60  # characters of a rejected expression quoted in the message


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()  # names[i] stands for low + i


_FIELDS = (
    _Field("minute", 0, 59),
    _Field("hour", 0, 23),
    _Field("day-of-month", 1, 31),
    _Field("month", 1, 12, MONTH_NAMES),
    _Field("day-of-week", 0, 7, DAY_NAMES),
)


@dataclass(frozen=True, kw_only=True)
class CronSpec:
    """A parsed expression: its normalised text, the value set of each field, and the flags the rules need."""

    expression: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday ... 6 = Saturday (7 is folded into 0)
    dom_star: bool  # the day-of-month field starts with "*" (Vixie DOM_STAR)
    dow_star: bool  # the day-of-week field starts with "*" (Vixie DOW_STAR)
    hour_wildcard: bool  # "*" or "/" in the hour field: fall back fires at both occurrences

    @property
    def day_or(self) -> bool:
        """True: a day matching either day field fires (both restricted); False: it must match both."""
        return not (self.dom_star or self.dow_star)

    @cached_property
    def croniter_args(self) -> tuple[str, bool]:
        """``(expression, day_or)`` for croniter: number lists, ``*`` only for a full set.

        croniter picks OR or AND from its own reading of the text: it ORs
        ``*/2`` with the weekday (Vixie ANDs it), and ANDs when a field reads
        ``*``, which would make ``1-31`` OR ``MON`` mean Mondays only. So the
        day rule is decided here, and ``*`` is written only where it cannot
        change the result.
        """
        days, weekdays = _text(self.days, _FIELDS[2]), _text(self.weekdays, _FIELDS[4])
        if self.day_or and "*" in (days, weekdays):
            days = weekdays = "*"  # "1-31" or "0-6", OR the other field: every day
        fields = (
            _text(self.minutes, _FIELDS[0]),
            _text(self.hours, _FIELDS[1]),
            days,
            _text(self.months, _FIELDS[3]),
            weekdays,
        )
        return " ".join(fields), self.day_or and "*" not in (days, weekdays)


def parse(expr: object) -> CronSpec:
    """Parse a five-field expression, or raise ``InvalidCron`` naming the field and token at fault."""
    if not isinstance(expr, str):
        raise InvalidCron("cron expression must be a string")
    return _parse(" ".join(expr.split()))


def normalise(expr: object) -> str:
    """The stored form: fields separated by one space, names in upper case."""
    return parse(expr).expression


@lru_cache(maxsize=1024)
def _parse(text: str) -> CronSpec:
    # Cached on the collapsed text (at most MAX_LENGTH characters once accepted;
    # errors are not cached): the tick evaluates the same expressions again and again.
    # Messages quote the text as written; the stored form has names in upper case.
    fields = text.split()
    if len(fields) == 1 and text.startswith("@"):
        raise _invalid(text, f"macros such as {fields[0]!r} are not supported; write the five fields")
    if len(fields) != 5:
        raise _invalid(text, f"expected 5 fields (minute hour day-of-month month day-of-week), got {len(fields)}")
    if len(text) > MAX_LENGTH:
        raise _invalid(text, f"longer than {MAX_LENGTH} characters")
    sets = [_parse_field(field_text, field, text) for field_text, field in zip(fields, _FIELDS, strict=True)]
    spec = CronSpec(
        expression=text.upper(),
        minutes=sets[0],
        hours=sets[1],
        days=sets[2],
        months=sets[3],
        weekdays=frozenset(0 if d == 7 else d for d in sets[4]),
        dom_star=fields[2].startswith("*"),
        dow_star=fields[4].startswith("*"),
        hour_wildcard="*" in fields[1] or "/" in fields[1],
    )
    # Both fields restricted: some weekday comes every month. Otherwise a date
    # must exist; over the 400-year calendar cycle every date falls on every weekday.
    if not spec.day_or and not any(d <= _MONTH_DAYS[m - 1] for m in spec.months for d in spec.days):
        raise InvalidCron(
            f"cron expression {_quote(text)} never matches: no month in {fields[3]!r} has day {fields[2]!r}"
        )
    return spec


def _parse_field(field_text: str, field: _Field, text: str) -> frozenset[int]:
    values: set[int] = set()
    for item in field_text.split(","):
        if not item:
            raise _invalid(text, f"{field.name} field: empty list item in {field_text!r}")
        values.update(_parse_item(item, field, text))
    return frozenset(values)


def _parse_item(item: str, field: _Field, text: str) -> range:
    base, slash, step_text = item.partition("/")
    step = 1
    if slash:
        if not _NUMBER.fullmatch(step_text):
            raise _unrecognised(text, field, item)
        step = int(step_text)
        if not 1 <= step <= field.high:
            raise _invalid(text, f"{field.name} field: step {step_text!r} in {item!r} must be 1 to {field.high}")
    if base == "*":
        return range(field.low, field.high + 1, step)
    start_text, dash, end_text = base.partition("-")
    start = _value(start_text, field, text, item)
    if not dash:
        if slash:
            raise _invalid(
                text,
                f"{field.name} field: {item!r} steps from a single value; write a range "
                f"({start_text}-{field.high}/{step_text}) or */{step_text}",
            )
        return range(start, start + 1)
    end = _value(end_text, field, text, item)
    if start > end:
        raise _invalid(text, f"{field.name} field: range {base!r} is reversed (start > end)")
    return range(start, end + 1, step)


def _value(token: str, field: _Field, text: str, item: str) -> int:
    if _NUMBER.fullmatch(token):
        value = int(token)
        if not field.low <= value <= field.high:
            where = f" in {item!r}" if item != token else ""
            raise _invalid(text, f"{field.name} field: {token!r}{where} is out of range {field.low}-{field.high}")
        return value
    if _WORD.fullmatch(token):
        name = token.upper()
        if name in field.names:
            return field.low + field.names.index(name)
        other = "month" if name in MONTH_NAMES else "day-of-week" if name in DAY_NAMES else None
        if other is not None:
            raise _invalid(text, f"{field.name} field: {token!r} is a {other} name")
    raise _unrecognised(text, field, item)


def _unrecognised(text: str, field: _Field, item: str) -> InvalidCron:
    return _invalid(text, f"{field.name} field: {item!r} is not a number, name, '*', list, range or step")


def _invalid(text: str, reason: str) -> InvalidCron:
    return InvalidCron(f"invalid cron expression {_quote(text)}: {reason}")


def _quote(text: str) -> str:
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")


def _text(values: frozenset[int], field: _Field) -> str:
    full = set(range(field.low, field.high + 1)) - ({7} if field.name == "day-of-week" else set())
    return "*" if values == full else ",".join(str(v) for v in sorted(values))
