"""System checks: warn about settings that break distsched's guarantees."""

from __future__ import annotations

import math

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

from .conf import CHOICES, DEFAULTS, RANGES

TAG = "distsched"
"""The tag of distsched's own checks: the only ones ``runworker`` and ``tick`` run at start-up."""


@register(TAG)
def check_distsched_settings(app_configs, **kwargs):
    problems: list[CheckMessage] = []
    user = getattr(settings, "DISTSCHED", None) or {}
    for key in user:
        if key not in DEFAULTS:
            problems.append(Warning(f"Unknown DISTSCHED setting {key!r}.", id="distsched.W001"))
    problems.extend(value_errors(user))
    problems.extend(queues_errors(user))
    problems.extend(task_requires_errors(user))
    problems.extend(limits_errors(user))
    problems.extend(declared_schedules_errors(user))
    problems.extend(task_options_errors())
    problems.extend(retention_errors(user))
    problems.extend(sqlite_mode_warnings(settings.DATABASES))
    lease = user.get("LEASE_SECONDS", DEFAULTS["LEASE_SECONDS"])
    beat = user.get("HEARTBEAT_SECONDS", DEFAULTS["HEARTBEAT_SECONDS"])
    if isinstance(lease, int | float) and isinstance(beat, int | float) and beat * 2 > lease:
        problems.append(
            Warning(
                "DISTSCHED HEARTBEAT_SECONDS should be at most half of LEASE_SECONDS.",
                hint="Otherwise a healthy worker can lose the lease of a long task.",
                id="distsched.W003",
            )
        )
    return problems


def sqlite_mode_warnings(databases: dict) -> list[Warning]:
    problems: list[Warning] = []
    for alias, db in databases.items():
        if db.get("ENGINE") == "django.db.backends.sqlite3":
            mode = (db.get("OPTIONS") or {}).get("transaction_mode")
            if mode != "IMMEDIATE":
                problems.append(
                    Warning(
                        f"Database {alias!r} is SQLite without OPTIONS['transaction_mode'] = 'IMMEDIATE'.",
                        hint="Concurrent workers then fail with 'database is locked' on lock upgrade.",
                        id="distsched.W002",
                    )
                )
    return problems


def value_errors(user: dict) -> list[Error]:
    """A numeric setting out of its range, or a choice not offered: refused before any process starts."""
    problems = []
    for key, (kind, low, high) in RANGES.items():
        if key not in user:
            continue
        value = user[key]
        try:
            number = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan
        except OverflowError:
            number = math.inf
        fits = math.isfinite(number) and low <= number <= high and (kind is float or number.is_integer())
        if not fits:
            what = "a whole number" if kind is int else "a number"
            problems.append(
                Error(
                    f"DISTSCHED[{key!r}] must be {what} from {low:g} to {high:g}, not {value!r}.", id="distsched.E001"
                )
            )
    for key, allowed in CHOICES.items():
        if key in user and user[key] not in allowed:
            problems.append(
                Error(
                    f"DISTSCHED[{key!r}] must be one of {', '.join(map(repr, allowed))}, not {user[key]!r}.",
                    id="distsched.E002",
                )
            )
    return problems


def queues_errors(user: dict) -> list[Error]:
    """``QUEUES``: None (any well-formed name), or a non-empty list of well-formed names with ``default``."""
    from .services.validation import QUEUE_RE

    queues = user.get("QUEUES")
    if queues is None:
        return []
    names = list(queues) if isinstance(queues, list | tuple) else None
    if not names or not all(isinstance(q, str) and QUEUE_RE.fullmatch(q) for q in names):
        return [
            Error(
                f"DISTSCHED['QUEUES'] must be None or a non-empty list of queue names, not {queues!r}.",
                hint="A queue name has 1-100 letters, digits, '.', '-' and '_'.",
                id="distsched.E003",
            )
        ]
    if "default" not in names:
        return [Error("DISTSCHED['QUEUES'] must include 'default' (where runs go unless told).", id="distsched.E003")]
    return []


def task_requires_errors(user: dict) -> list[Error]:
    """``TASK_REQUIRES``: a dict of task name -> non-empty list of capability names."""
    from .services.capabilities import CAPABILITY_RULE, task_requires_problem

    if "TASK_REQUIRES" not in user:
        return []
    problem = task_requires_problem(user["TASK_REQUIRES"])
    if problem is None:
        return []
    return [
        Error(
            f"DISTSCHED['TASK_REQUIRES'] {problem}.",
            hint=f"For example {{'reports.render': ['gpu']}}; {CAPABILITY_RULE}.",
            id="distsched.E004",
        )
    ]


def limits_errors(user: dict) -> list[Error]:
    """``LIMITS``: a dict of limit name -> limit (``services.limit_rules`` says what a limit is)."""
    from .services.limit_rules import limits_problem

    if "LIMITS" not in user:
        return []
    problem = limits_problem()
    if problem is None:
        return []
    return [
        Error(
            f"DISTSCHED['LIMITS'] {problem}.",
            hint="For example {'billing': {'task': 'billing.charge', 'concurrency': 1, "
            "'partition_by': ['account_id']}}.",
            id="distsched.E005",
        )
    ]


def declared_schedules_errors(user: dict) -> list[Error]:
    """``SCHEDULES``: each declaration valid as a schedule (``services.declared_schedules``), one
    error per schedule naming it and the field."""
    from .clock import current_clock
    from .services.declared_schedules import problems

    return [
        Error(
            f"DISTSCHED['SCHEDULES'] {problem}.",
            hint="For example {'nightly-report': {'task': 'reports.nightly', 'cron': '0 3 * * *'}}.",
            id="distsched.E020",
        )
        for problem in problems(user.get("SCHEDULES"), now=current_clock().now())
    ]


def task_options_errors() -> list[Error]:
    """``TASK_OPTIONS`` and ``@task(...)``'s options: known keys, valid values, importable exception classes."""
    from .services.task_options import problems

    return [
        Error(
            f"DISTSCHED['TASK_OPTIONS'] {problem}.",
            hint="For example {'billing.charge': {'max_attempts': 5, 'retry_on': ['requests.Timeout']}}.",
            id="distsched.E021",
        )
        for problem in problems()
    ]


def retention_errors(user: dict) -> list[Error]:
    """``RETENTION``: final state -> age (``services.retention.policy`` reads it)."""
    from .errors import ValidationError
    from .services.retention import policy

    if "RETENTION" not in user:
        return []
    try:
        policy(user["RETENTION"])
    except ValidationError as exc:
        return [
            Error(
                f"DISTSCHED['RETENTION'] is invalid: {exc}.",
                hint="For example {'succeeded': '7d', 'dead': '90d'}; states not named are kept forever.",
                id="distsched.E022",
            )
        ]
    return []
