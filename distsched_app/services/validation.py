"""Central validation of schedule input: typed errors, before anything is written."""

from __future__ import annotations

import json
import math
import re
import sys
from datetime import datetime
from typing import Any

from django.db import models

from ..clock import iso_utc
from ..conf import conf
from ..errors import (
    InvalidInterval,
    InvalidName,
    InvalidPayload,
    InvalidScheduleSpec,
    RunAtInPast,
    ValidationError,
)
from ..framework import normalize_json
from ..models import CatchUp, Overlap, ScheduleKind
from ..recurrence import get_zone, validate_cron
from ..registry import registry
from ..text import nesting_exceeds, unstorable, unstorable_in

NAME_RE = re.compile(r"^[A-Za-z0-9_-]+$")
NAME_MAX = 100
QUEUE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
MAX_INTERVAL_SECONDS = 10 * 366 * 86400
MAX_ATTEMPTS_LIMIT = 1000
MIN_YEAR, MAX_YEAR = 1970, 9000


def validate_name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidName("name is required")
    if len(name) > NAME_MAX:
        raise InvalidName(f"name is longer than {NAME_MAX} characters")
    if not NAME_RE.fullmatch(name):  # fullmatch: "$" would accept a trailing newline
        raise InvalidName("name may contain only letters, digits, '-' and '_' (a slug)")
    return name


def validate_task_name(task_name: Any) -> str:
    if not isinstance(task_name, str) or not task_name:
        raise ValidationError("task_name is required", field="task_name")
    registry.get(task_name)  # raises UnknownTask
    return task_name


def _depth(value: Any, limit: int, field: str) -> None:
    """Bounded nesting (``MAX_PAYLOAD_DEPTH``, itself at most 100)."""
    if nesting_exceeds(value, limit):
        raise InvalidPayload(f"{field} is nested deeper than {limit} levels", field=field)


def check_storable(value: str, *, field: str, error: type[ValidationError] = ValidationError) -> str:
    """Refuse text that one of the databases cannot store (``text.unstorable``), naming the field."""
    problem = unstorable(value)
    if problem is not None:
        raise error(f"{field} contains {problem}, which cannot be stored", field=field)
    return value


def validate_payload(value: Any, *, field: str) -> Any:
    """args must be a JSON list, kwargs a JSON object; bounded in size and depth."""
    return validated_json(value, field=field)[0]


def validated_json(value: Any, *, field: str) -> tuple[Any, str]:
    """``validate_payload``, and the value's JSON text (what is stored: encoded once)."""
    expected = list if field == "args" else dict
    if value is None:
        value = expected()
    if field == "args" and isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, expected):
        kind = "list" if expected is list else "object"
        raise InvalidPayload(f"{field} must be a JSON {kind}", field=field)
    if not value:
        return expected(), "[]" if expected is list else "{}"
    if isinstance(value, dict) and not all(isinstance(k, str) for k in value):
        raise InvalidPayload(f"{field} keys must be strings", field=field)
    _depth(value, conf.MAX_PAYLOAD_DEPTH, field)
    problem = unstorable_in(value)
    if problem is not None:
        raise InvalidPayload(f"{field} contains {problem}, which cannot be stored", field=field)
    try:
        encoded = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"{field} is not JSON-serialisable: {exc}", field=field) from None
    limit = conf.MAX_PAYLOAD_BYTES
    if len(encoded.encode()) > limit:
        raise InvalidPayload(f"{field} is larger than {limit} bytes", field=field)
    return json.loads(encoded), encoded


def decode_payload(text: str, *, field: str) -> Any:
    """JSON text an operator typed for ``args``/``kwargs`` (the admin form, the CLI), decoded for
    ``validate_payload``; ``InvalidPayload`` naming the field for text that is no JSON, a number
    with more digits than Python converts, or nesting deeper than ``MAX_PAYLOAD_DEPTH``.

    Decoding deeper than the interpreter's recursion limit raises ``RecursionError``; what does
    decode is measured before it is returned, so rendering it back cannot overflow either.
    """
    limit = conf.MAX_PAYLOAD_DEPTH
    try:
        value = json.loads(text)
    except RecursionError:
        raise InvalidPayload(f"{field} is nested deeper than {limit} levels", field=field) from None
    except json.JSONDecodeError as exc:
        raise InvalidPayload(f"invalid JSON in {field}: {exc}", field=field) from None
    except ValueError:  # the integer string conversion limit (sys.set_int_max_str_digits)
        digits = sys.get_int_max_str_digits()
        raise InvalidPayload(f"{field} holds a number with more than {digits} digits", field=field) from None
    _depth(value, limit, field)
    return value


def framework_payload(value: Any, *, field: str) -> Any:
    """A framework task's ``args``/``kwargs`` normalised as the framework does (``normalize_json``:
    bytes as UTF-8 text, any mapping as a dict, any sequence as a list), for ``validate_payload``.

    What the framework refuses (a type JSON cannot hold: ``TypeError``; undecodable bytes:
    ``ValueError``) is an ``InvalidPayload`` too, so ``Task.enqueue`` raises one error for every
    payload it refuses. The depth is measured first: ``normalize_json`` recurses once per level.
    """
    limit = conf.MAX_PAYLOAD_DEPTH
    _depth(value, limit, field)
    try:
        return normalize_json(value)
    except RecursionError:  # nested mappings or sequences other than dicts, lists and tuples
        raise InvalidPayload(f"{field} is nested deeper than {limit} levels", field=field) from None
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"{field} cannot be passed to a task as JSON: {exc}", field=field) from None


def parse_datetime(value: Any, *, field: str) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise ValidationError(f"{field} is not an ISO 8601 datetime", field=field) from None
    if not isinstance(value, datetime):
        raise ValidationError(f"{field} must be a datetime", field=field)
    if value.tzinfo is None:
        raise ValidationError(f"{field} needs a time zone offset (e.g. 'Z' or '+00:00')", field=field)
    if not MIN_YEAR <= value.year < MAX_YEAR:
        # Far dates overflow recurrence arithmetic (year 9999 is datetime's limit).
        raise ValidationError(f"{field} must be between the years {MIN_YEAR} and {MAX_YEAR - 1}", field=field)
    return value


def bounded_int(value: Any, *, field: str, low: int, high: int, error: type[ValidationError] = ValidationError) -> int:
    """A whole number in ``[low, high]`` (an integral float is accepted), else ``error``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (isinstance(value, float) and not value.is_integer())
    ):
        raise error(f"{field} must be a whole number", field=field)
    value = int(value)
    if not low <= value <= high:
        raise error(f"{field} must be between {low} and {high}", field=field)
    return value


def bounded_float(value: Any, *, field: str, low: float, high: float, low_open: bool = False) -> float:
    """A finite number in ``[low, high]`` (``(low, high]`` with ``low_open``), else ``ValidationError``.

    Huge integers are refused here rather than raising ``OverflowError`` when converted.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(f"{field} must be a number", field=field)
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number) or not low <= number <= high or (low_open and number == low):
        if low_open:
            raise ValidationError(f"{field} must be greater than {low:g} and at most {high:g}", field=field)
        raise ValidationError(f"{field} must be between {low:g} and {high:g}", field=field)
    return number


MAX_WORKER_ID = 200
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def validate_worker_id(worker_id: Any) -> str:
    """A worker id is stored in every lease and event it writes: 1-200 printable characters."""
    if not isinstance(worker_id, str) or not worker_id:
        raise ValidationError("worker_id must be a non-empty string", field="worker_id")
    if len(worker_id) > MAX_WORKER_ID:
        raise ValidationError(f"worker_id is longer than {MAX_WORKER_ID} characters", field="worker_id")
    check_storable(worker_id, field="worker_id")
    if _CONTROL.search(worker_id):
        raise ValidationError("worker_id must not contain control characters", field="worker_id")
    return worker_id


def validate_queue(queue: Any, *, field: str = "queue") -> str:
    """A well-formed queue name, and one of ``DISTSCHED["QUEUES"]`` when that is set (a typo
    would make runs that no worker serves)."""
    if not isinstance(queue, str) or not QUEUE_RE.fullmatch(queue):
        raise ValidationError("queue may contain only letters, digits, '.', '-' and '_' (1-100)", field=field)
    allowed = conf.QUEUES
    if allowed is not None and queue not in allowed:
        raise ValidationError(f"queue {queue!r} is not one of DISTSCHED['QUEUES'] ({', '.join(allowed)})", field=field)
    return queue


def backend_queues(task_name: str) -> frozenset[str]:
    """The queues a framework task's backend accepts (``TASKS[alias]["QUEUES"]``); empty: any
    (a plain distsched task, ``"QUEUES": []``, or an alias no longer in ``TASKS``)."""
    entry = registry.find(task_name)
    task = entry.framework_task if entry is not None else None
    if task is None:
        return frozenset()
    try:
        backend = task.get_backend()
    except Exception:  # noqa: BLE001 - an alias no longer in TASKS: nothing to check against
        return frozenset()
    return frozenset(getattr(backend, "queues", None) or ())


def validate_task_queue(task_name: str, queue: str) -> str:
    """A framework task's run must be on a queue its backend accepts, the check of the backend's own
    ``enqueue`` (``validate_task``); a schedule or an operator's enqueue elsewhere would write runs the
    framework refuses to describe (``InvalidTaskError``)."""
    queues = backend_queues(task_name)
    if queues and queue not in queues:
        raise ValidationError(
            f"queue {queue!r} is not one of its backend's QUEUES ({', '.join(sorted(queues))})", field="queue"
        )
    return queue


def _choice(value: Any, choices: type[models.TextChoices], *, field: str) -> str:
    if value not in choices.values:
        raise ValidationError(f"{field} must be one of {', '.join(choices.values)}", field=field)
    return value


def validate_schedule_fields(data: dict[str, Any], *, now: datetime, check_run_at: bool = True) -> dict[str, Any]:
    """Normalise a full set of schedule fields or raise the first error found.

    Returns a dict ready to assign to a Schedule. ``kind`` is inferred from
    which of interval_seconds / cron / run_at is given when not set.
    """
    out: dict[str, Any] = {}
    out["task_name"] = validate_task_name(data.get("task_name"))
    out["args"] = validate_payload(data.get("args"), field="args")
    out["kwargs"] = validate_payload(data.get("kwargs"), field="kwargs")

    interval = data.get("interval_seconds")
    cron = data.get("cron") or ""
    run_at = parse_datetime(data.get("run_at"), field="run_at")
    given = [k for k, v in (("interval", interval), ("cron", cron), ("once", run_at)) if v not in (None, "")]
    kind = data.get("kind") or (given[0] if len(given) == 1 else None)
    if len(given) != 1 or kind not in ScheduleKind.values or given[0] != kind:
        raise InvalidScheduleSpec("give exactly one of interval_seconds (interval), cron (cron) or run_at (once)")
    out["kind"] = kind
    out["interval_seconds"] = None
    out["cron"] = ""
    out["run_at"] = None
    if kind == ScheduleKind.INTERVAL:
        out["interval_seconds"] = bounded_int(
            interval, field="interval_seconds", low=1, high=MAX_INTERVAL_SECONDS, error=InvalidInterval
        )
    elif kind == ScheduleKind.CRON:
        if not isinstance(cron, str):
            raise ValidationError("cron must be a string", field="cron")
        out["cron"] = validate_cron(cron)
    else:
        if run_at is None:  # kind once was inferred from run_at, or checked against it above
            raise InvalidScheduleSpec("a once schedule needs run_at")
        if check_run_at and run_at < now:
            raise RunAtInPast(f"run_at {iso_utc(run_at)} is in the past")
        out["run_at"] = run_at

    tz = data.get("timezone") or "UTC"
    if not isinstance(tz, str):
        raise ValidationError("timezone must be a string", field="timezone")
    get_zone(tz)
    if kind != ScheduleKind.CRON and tz != "UTC":
        # Interval and once schedules are UTC arithmetic: a zone would be silently ignored.
        raise ValidationError(f"timezone applies to cron schedules only, not to {kind} schedules", field="timezone")
    out["timezone"] = tz
    start_at = parse_datetime(data.get("start_at"), field="start_at")
    if start_at is not None and kind == ScheduleKind.ONCE:
        raise ValidationError("start_at applies to interval and cron schedules; use run_at", field="start_at")
    out["start_at"] = start_at

    # What the schedule leaves out (None) is its task's declaration's (TASK_OPTIONS, @task, a framework
    # task's queue and backend OPTIONS: ``enqueue.declared``), else the DISTSCHED defaults; stored as values.
    from .enqueue import declared

    task = declared(out["task_name"])
    policy = task.policy
    max_attempts = data.get("max_attempts")
    if max_attempts is None:
        max_attempts = conf.MAX_ATTEMPTS if policy is None else policy.max_attempts
    out["max_attempts"] = bounded_int(max_attempts, field="max_attempts", low=1, high=MAX_ATTEMPTS_LIMIT)
    base = data.get("retry_base_seconds")
    if base is None:
        base = conf.RETRY_BASE_SECONDS if policy is None else policy.base
    out["retry_base_seconds"] = bounded_float(base, field="retry_base_seconds", low=0, high=86400 * 30)
    cap = data.get("retry_max_seconds")
    if cap is None:
        cap = conf.RETRY_MAX_SECONDS if policy is None else policy.cap
    out["retry_max_seconds"] = bounded_float(cap, field="retry_max_seconds", low=0, high=86400 * 365)
    if out["retry_max_seconds"] < out["retry_base_seconds"]:
        raise ValidationError("retry_max_seconds must be at least retry_base_seconds", field="retry_max_seconds")
    jitter = data.get("retry_jitter")
    if jitter is None:
        jitter = 0 if policy is None else policy.jitter
    out["retry_jitter"] = bounded_float(jitter, field="retry_jitter", low=0, high=1)
    out["catch_up"] = _choice(data.get("catch_up") or conf.CATCH_UP, CatchUp, field="catch_up")
    out["overlap"] = _choice(data.get("overlap") or Overlap.ALLOW, Overlap, field="overlap")
    out["queue"] = validate_task_queue(out["task_name"], validate_queue(data.get("queue") or task.queue))
    paused = data.get("paused", False)
    if not isinstance(paused, bool):
        raise ValidationError("paused must be true or false", field="paused")
    out["paused"] = paused
    return out
