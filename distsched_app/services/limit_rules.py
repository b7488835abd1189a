"""Declared limits: ``DISTSCHED["LIMITS"]`` parsed and checked, which limits a run is under, its
partition key, and the admission maths (GCRA for rates). No database here; ``services.limits``
applies these rules in the claim.

A limit is a named resource::

    DISTSCHED["LIMITS"] = {
        "reports": {"queue": "reports", "concurrency": 2},
        "billing": {"task": "billing.charge", "concurrency": 1, "partition_by": ["account_id"]},
        "partner-api": {"task": ["webhooks.deliver", "webhooks.resend"], "rate": "100/m",
                        "partition_by": ["kwargs.partner"], "per_partition": {"acme": {"rate": "1000/m"}}},
        "gpu": {"task": "ml.train", "total": 8, "fair": True, "local": 1, "partition_by": ["tenant_id"]},
    }

- ``task`` / ``queue``: a name or a list; the limit applies to a run of any of them.
- ``concurrency``: at most N runs of one partition hold a live lease (leased or running).
- ``total``: at most N runs of the whole limit, all partitions together.
- ``rate`` ("N/s", "N/m", "N/h", or "N/<k><unit>") and ``burst`` (default 1): per partition,
  never more than N starts in any window of that length (``burst`` b > 1: at most N + b - 1).
- ``partition_by``: where the partition key comes from: a keyword argument (``"account_id"``),
  a dotted path (``"kwargs.customer.id"``, ``"args.0"``) or a function ``"module:function"``
  called with ``(task_name, args, kwargs)``; several paths make a compound key.
- ``missing``: a run without the key: ``"error"`` (default: enqueue refuses it), ``"shared"``
  (such runs share the partition ""), ``"exempt"`` (the limit does not apply to it).
- ``per_partition``: ``{key: {"concurrency"|"rate"|"burst": ...}}`` for named partitions.
- ``fair`` (needs ``total``): a freed slot goes to the partition admitted least recently.
- ``local``: at most N of the limit's runs per worker.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from ..conf import conf
from ..errors import ValidationError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
NAME_RULE = "a limit name has 1-100 letters, digits, '.', '-' and '_', starting with a letter or digit"
RATE_RE = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*(s|m|h)\s*$")
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600}
MISSING = ("error", "shared", "exempt")
KEYS = {"task", "queue", "concurrency", "total", "rate", "burst", "partition_by", "missing", "per_partition",
        "fair", "local"}  # fmt: skip
NUMBERS = ("concurrency", "total", "rate", "burst", "local")  # what overrides and per_partition may set
PARTITION_NUMBERS = ("concurrency", "rate", "burst")
MAX_COUNT = 1_000_000
MAX_KEY = 200  # LimitPartition.key


class LimitKeyMissing(ValidationError):
    """A run under a limit with ``missing="error"`` lacks the partition key."""

    field = "kwargs"


@dataclass(frozen=True)
class Rate:
    count: int
    period: float  # seconds

    @property
    def interval(self) -> float:
        """GCRA's emission interval T: one start every ``period / count`` seconds."""
        return self.period / self.count

    def __str__(self) -> str:
        unit = next((u for u, s in UNIT_SECONDS.items() if self.period == s), None)
        return f"{self.count}/{unit}" if unit else f"{self.count}/{self.period:g}s"


def parse_rate(value: Any) -> Rate:
    """``"N/s"``, ``"N/m"``, ``"N/h"``, ``"N/10s"``: N starts per period (N and the period at least 1)."""
    match = RATE_RE.fullmatch(value) if isinstance(value, str) else None
    if not match or int(match.group(1)) < 1 or int(match.group(1)) > MAX_COUNT or match.group(2) in ("0",):
        raise ValidationError(f"rate must look like '5/s', '100/m', '1000/h' or '10/30s', not {value!r}", field="rate")
    count, multiple, unit = int(match.group(1)), int(match.group(2) or 1), match.group(3)
    if multiple < 1 or multiple * UNIT_SECONDS[unit] > 86400:
        raise ValidationError(f"a rate's period is 1 second to 1 day, not {value!r}", field="rate")
    return Rate(count, multiple * UNIT_SECONDS[unit])


@dataclass(frozen=True, kw_only=True)
class Numbers:
    """A limit's numbers for one partition at one moment (declared, per_partition, override)."""

    concurrency: int | None = None
    total: int | None = None
    rate: Rate | None = None
    burst: int = 1
    local: int | None = None
    paused: bool = False


@dataclass(frozen=True, kw_only=True)
class LimitSpec:
    name: str
    tasks: frozenset[str]
    queues: frozenset[str]
    numbers: Numbers
    partition_by: tuple[str, ...] = ()
    missing: str = "error"
    per_partition: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    fair: bool = False

    def applies(self, task_name: str, queue: str) -> bool:
        return task_name in self.tasks or queue in self.queues

    def numbers_for(self, key: str, override: Mapping[str, Any] | None = None) -> Numbers:
        """Declared, then the named partition's values, then the operator's override (wins)."""
        numbers = self.numbers
        if key in self.per_partition:
            numbers = _with(numbers, self.per_partition[key])
        if override:
            numbers = _with(numbers, override)
        return numbers


def _with(numbers: Numbers, values: Mapping[str, Any]) -> Numbers:
    changes: dict[str, Any] = {}
    for name, value in values.items():
        if name == "rate":
            changes["rate"] = None if value is None else parse_rate(value)
        elif name == "paused":
            changes["paused"] = bool(value)
        elif name == "burst":
            changes["burst"] = 1 if value is None else int(value)
        elif name in NUMBERS:
            changes[name] = None if value is None else int(value)
    return replace(numbers, **changes)


def _names(value: Any, what: str, limit: str) -> frozenset[str]:
    if value is None:
        return frozenset()
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list | tuple) or not all(isinstance(v, str) and v for v in values):
        raise ValidationError(f"[{limit!r}] {what} must be a name or a list of names, not {value!r}", field=what)
    return frozenset(values)


def _count(value: Any, what: str, limit: str, *, low: int = 1) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_COUNT:
        raise ValidationError(f"[{limit!r}] {what} must be a whole number {low}-{MAX_COUNT}, not {value!r}", field=what)
    return value


def check_numbers(values: Mapping[str, Any], *, allowed: Sequence[str], where: str) -> None:
    """Numbers a limit, a named partition or an override may carry: known names, valid values."""
    unknown = set(values) - set(allowed)
    if unknown:
        raise ValidationError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}", field=sorted(unknown)[0])
    for name in ("concurrency", "total", "local"):
        if name in values:
            _count(values[name], name, where, low=0 if name != "local" else 1)
    if values.get("rate") is not None:
        parse_rate(values["rate"])
    if "burst" in values:
        _count(values["burst"], "burst", where)
    if "paused" in values and not isinstance(values["paused"], bool):
        raise ValidationError(f"{where}: paused must be true or false", field="paused")


def parse_limit(name: Any, value: Any) -> LimitSpec:
    """One entry of ``DISTSCHED["LIMITS"]``, checked (a ``ValidationError`` says what is wrong)."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise ValidationError(f"invalid limit name {name!r}: {NAME_RULE}", field="name")
    if not isinstance(value, Mapping):
        raise ValidationError(f"[{name!r}] must be a dict, not {value!r}", field=name)
    unknown = set(value) - KEYS
    if unknown:
        raise ValidationError(f"[{name!r}] has unknown key(s): {', '.join(sorted(unknown))}", field=sorted(unknown)[0])
    tasks, queues = _names(value.get("task"), "task", name), _names(value.get("queue"), "queue", name)
    if not tasks and not queues:
        raise ValidationError(f"[{name!r}] applies to nothing: give a 'task' or a 'queue' (or both)", field="task")
    check_numbers({k: v for k, v in value.items() if k in NUMBERS}, allowed=NUMBERS, where=repr(name))
    numbers = _with(Numbers(), {k: v for k, v in value.items() if k in NUMBERS})
    if numbers.concurrency is None and numbers.total is None and numbers.rate is None:
        raise ValidationError(f"[{name!r}] limits nothing: give 'concurrency', 'total' or 'rate'", field="concurrency")
    paths = value.get("partition_by") or ()
    paths = (paths,) if isinstance(paths, str) else paths
    if not isinstance(paths, list | tuple) or not all(isinstance(p, str) and p.strip() for p in paths):
        raise ValidationError(f"[{name!r}] partition_by must be a list of paths, not {paths!r}", field="partition_by")
    for path in paths:
        _check_path(path, name)
    missing = value.get("missing", "error")
    if missing not in MISSING:
        raise ValidationError(
            f"[{name!r}] missing must be one of {', '.join(MISSING)}, not {missing!r}", field="missing"
        )
    per_partition = value.get("per_partition") or {}
    if not isinstance(per_partition, Mapping):
        raise ValidationError(f"[{name!r}] per_partition must be a dict of key -> numbers", field="per_partition")
    if per_partition and not paths:
        raise ValidationError(f"[{name!r}] per_partition needs partition_by", field="per_partition")
    for key, numbers_of in per_partition.items():
        if not isinstance(key, str) or not isinstance(numbers_of, Mapping):
            raise ValidationError(f"[{name!r}] per_partition[{key!r}] must be a dict of numbers", field="per_partition")
        check_numbers(numbers_of, allowed=PARTITION_NUMBERS, where=f"[{name!r}] per_partition[{key!r}]")
    fair = value.get("fair", False)
    if not isinstance(fair, bool):
        raise ValidationError(f"[{name!r}] fair must be true or false", field="fair")
    if fair and (numbers.total is None or not paths):
        raise ValidationError(
            f"[{name!r}] fair shares a 'total' among partitions: it needs 'total' and 'partition_by'", field="fair"
        )
    if numbers.total is not None and not paths:
        raise ValidationError(f"[{name!r}] total caps all partitions together: it needs 'partition_by' "
                              "(without partitions, use concurrency)", field="total")  # fmt: skip
    return LimitSpec(
        name=name,
        tasks=tasks,
        queues=queues,
        numbers=numbers,
        partition_by=tuple(p.strip() for p in paths),
        missing=missing,
        per_partition={k: dict(v) for k, v in per_partition.items()},
        fair=fair,
    )


def _check_path(path: str, limit: str) -> None:
    if ":" in path:
        module, _, attr = path.partition(":")
        try:
            target = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ValidationError(
                f"[{limit!r}] partition_by {path!r} cannot be imported: {exc}", field="partition_by"
            ) from None
        if not callable(target):
            raise ValidationError(f"[{limit!r}] partition_by {path!r} is not callable", field="partition_by")
        return
    head, *rest = path.split(".")
    if head == "args" and (not rest or not rest[0].isdigit()):
        raise ValidationError(f"[{limit!r}] partition_by {path!r}: 'args.<index>' needs an index", field="partition_by")
    if head == "kwargs" and not rest:
        raise ValidationError(f"[{limit!r}] partition_by {path!r}: 'kwargs.<name>' needs a name", field="partition_by")


_cache: tuple[object, dict[str, LimitSpec]] | None = None


def declared() -> dict[str, LimitSpec]:
    """The current ``DISTSCHED["LIMITS"]``, parsed once per settings value (``override_settings``
    takes effect at once). A malformed value raises: the system check (distsched.E005) says so first."""
    global _cache
    value = conf.LIMITS
    if _cache is not None and _cache[0] is value:
        return _cache[1]
    if not isinstance(value, Mapping):
        raise ValidationError("DISTSCHED['LIMITS'] must be a dict of limit name -> limit", field="LIMITS")
    specs = {name: parse_limit(name, spec) for name, spec in sorted(value.items())}
    _cache = (value, specs)
    return specs


def limits_problem() -> str | None:
    """What is wrong with ``DISTSCHED["LIMITS"]``, or None."""
    try:
        declared()
    except ValidationError as exc:
        return str(exc)
    return None


def applicable(task_name: str, queue: str) -> list[LimitSpec]:
    """The declared limits a run of this task in this queue is under, in name order (the order
    admission locks them in, so two claimers never wait on each other in a circle)."""
    return [spec for spec in declared().values() if spec.applies(task_name, queue)]


def may_apply(queues: Sequence[str] | None) -> bool:
    """Whether a claim on these queues (None: any) could meet a limited run: False lets the
    one-statement claim serve it, since it does not admit."""
    specs = declared().values()
    if not queues:
        return bool(specs)
    return any(spec.tasks or spec.queues & set(queues) for spec in specs)


class _Missing(Exception):
    pass


def _lookup(path: str, task_name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    if ":" in path:
        module, _, attr = path.partition(":")
        value = getattr(importlib.import_module(module), attr)(task_name, list(args), dict(kwargs))
        if value is None:
            raise _Missing
        return value
    parts = path.split(".")
    if parts[0] == "args":
        current: Any = list(args)
        parts = parts[1:]
    elif parts[0] == "kwargs":
        current, parts = kwargs, parts[1:]
    else:
        current = kwargs
    for part in parts:
        if isinstance(current, Mapping) and part in current:
            current = current[part]
        elif isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            raise _Missing
    if current is None:
        raise _Missing
    return current


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def partition_key(spec: LimitSpec, task_name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
    """The run's partition of ``spec``: "" when unpartitioned; None when the key is missing and
    the limit exempts such runs. Raises ``LimitKeyMissing`` for ``missing="error"``."""
    if not spec.partition_by:
        return ""
    try:
        parts = [_text(_lookup(path, task_name, args, kwargs)) for path in spec.partition_by]
    except _Missing:
        if spec.missing == "exempt":
            return None
        if spec.missing == "shared":
            return ""
        paths = ", ".join(spec.partition_by)
        raise LimitKeyMissing(
            f"limit {spec.name!r} partitions runs by {paths}, which this run of {task_name} lacks", field="kwargs"
        ) from None
    key = "\x1f".join(parts) if len(parts) > 1 else parts[0]
    if len(key) > MAX_KEY:  # long keys stay distinct: a prefix and a digest
        key = key[: MAX_KEY - 17] + "~" + hashlib.sha256(key.encode()).hexdigest()[:16]
    return key


def keys_for(task_name: str, queue: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, str]:
    """``{limit: partition key}`` of every limit a new run is under (enqueue checks it, raising
    ``LimitKeyMissing``); exempt limits are left out."""
    out = {}
    for spec in applicable(task_name, queue):
        key = partition_key(spec, task_name, args, kwargs)
        if key is not None:
            out[spec.name] = key
    return out


# -- GCRA ------------------------------------------------------------------------------------


def conforms(rate: Rate, burst: int, tat: datetime | None, now: datetime) -> bool:
    """GCRA: a start at ``now`` conforms if ``now >= tat - tau``, tau = (burst - 1) * T. With
    burst 1, starts are at least T apart, so no window of one period holds more than N."""
    return tat is None or now >= tat - timedelta(seconds=(burst - 1) * rate.interval)


def next_tat(rate: Rate, tat: datetime | None, now: datetime) -> datetime:
    """The theoretical arrival time after a start at ``now``: ``max(tat, now) + T``."""
    base = now if tat is None or tat < now else tat
    return base + timedelta(seconds=rate.interval)


def earliest_start(rate: Rate, burst: int, tat: datetime | None, now: datetime) -> datetime:
    """When a start next conforms: ``tat - tau`` (now, if it already does)."""
    if tat is None:
        return now
    at = tat - timedelta(seconds=(burst - 1) * rate.interval)
    return at if at > now else now
