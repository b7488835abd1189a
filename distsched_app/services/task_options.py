"""Per-task options: ``DISTSCHED["TASK_OPTIONS"]`` and the keywords of distsched's ``@task``.

    DISTSCHED["TASK_OPTIONS"] = {"billing.charge": {"max_attempts": 5, "retry_on": ["requests.Timeout"],
                                                    "give_up_on": ["billing.errors.CardDeclined"], "queue": "io"}}

Keys: the retry policy (``max_attempts``, ``retry_base_seconds``, ``retry_max_seconds``,
``retry_jitter``), ``retry_on`` and ``give_up_on`` (exception classes: dotted paths, or classes on
``@task``), ``queue``, ``priority`` and ``timeout`` (seconds an attempt may take: ``timeout_of``).
The settings win over the decorator, key by key (``merged``). ``enqueue.declared`` turns them
into what a run of the task gets when its enqueue or schedule does not say; ``give_up_reason`` is
the failure path's question: is this exception one that must not be retried?
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from django.utils.module_loading import import_string

from ..conf import conf
from ..errors import DistschedError
from ..registry import TASK_OPTION_KEYS as KEYS
from ..registry import registry

POLICY_KEYS = ("max_attempts", "retry_base_seconds", "retry_max_seconds", "retry_jitter")
EXCEPTION_KEYS = ("retry_on", "give_up_on")
MAX_TIMEOUT_SECONDS = 7 * 86400


def merged(task_name: str) -> dict[str, Any]:
    """The task's options: its decorator's, with the settings' keys over them."""
    entry = registry.find(task_name)
    declared = dict(entry.options) if entry is not None else {}
    settings = conf.TASK_OPTIONS
    if isinstance(settings, dict) and isinstance(settings.get(task_name), dict):
        declared.update(settings[task_name])
    return declared


def timeout_of(task_name: str, decorator_options: dict[str, Any]) -> float | None:
    """The task's ``timeout`` in seconds, or None: the worker's question before each call, so it
    reads the two places directly (settings first) instead of merging every option."""
    settings = conf.TASK_OPTIONS
    own = settings.get(task_name) if isinstance(settings, dict) else None
    value = own["timeout"] if isinstance(own, dict) and "timeout" in own else decorator_options.get("timeout")
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None  # absent, or invalid (the system check reports it): no timeout


@lru_cache(maxsize=256)
def _imported(path: str) -> type[BaseException]:
    cls = import_string(path)
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        raise TypeError(f"{path} is not an exception class")
    return cls


def exception_classes(value: Any) -> tuple[type[BaseException], ...]:
    """``retry_on`` / ``give_up_on`` as classes; what cannot be imported is left out here (the
    system check reports it), so the failure path never fails on a setting."""
    found = []
    for item in _items(value):
        if isinstance(item, type) and issubclass(item, BaseException):
            found.append(item)
        elif isinstance(item, str):
            try:
                found.append(_imported(item))
            except (ImportError, TypeError, ValueError):
                continue
    return tuple(found)


def _items(value: Any) -> Iterable[Any]:
    if value is None:
        return ()
    if isinstance(value, str | type):
        return (value,)
    return value if isinstance(value, list | tuple) else ()


def give_up_reason(task_name: str, exception_type: type[BaseException] | None) -> str | None:
    """Why a failed attempt raising ``exception_type`` must not be retried, or None: it is in the
    task's ``give_up_on``, or the task has a ``retry_on`` and it is none of those."""
    if exception_type is None:
        return None
    options = merged(task_name)
    if not (options.get("retry_on") is not None or options.get("give_up_on")):
        return None
    name = exception_type.__name__
    give_up = exception_classes(options.get("give_up_on"))
    if give_up and issubclass(exception_type, give_up):
        return f"{name} is in the task's give_up_on"
    if options.get("retry_on") is not None:
        retry_on = exception_classes(options["retry_on"])
        if not (retry_on and issubclass(exception_type, retry_on)):
            return f"{name} is not in the task's retry_on"
    return None


def options_problem(task_name: Any, options: Any) -> str | None:
    """What is wrong with one task's options (the system check's and ``@task``'s question)."""
    from .enqueue import validate_policy
    from .validation import bounded_float, bounded_int, validate_queue

    if not isinstance(options, dict):
        return f"{task_name!r} must map to a dict of options, not {type(options).__name__}"
    unknown = sorted(str(k) for k in options if k not in KEYS)
    if unknown:
        return f"{task_name!r} has unknown option(s) {', '.join(unknown)} (known: {', '.join(KEYS)})"
    try:
        validate_policy({k: options[k] for k in POLICY_KEYS if k in options})
        if "queue" in options:
            validate_queue(options["queue"])
        if "priority" in options:
            bounded_int(options["priority"], field="priority", low=-100, high=100)
        if "timeout" in options:
            bounded_float(options["timeout"], field="timeout", low=0, high=MAX_TIMEOUT_SECONDS, low_open=True)
    except DistschedError as exc:
        return f"{task_name!r}: {exc}"
    for key in EXCEPTION_KEYS:
        if key not in options:
            continue
        value = options[key]
        if not isinstance(value, list | tuple) or isinstance(value, str):
            return f"{task_name!r}: {key} must be a list of exception classes (dotted paths), not {value!r}"
        for item in value:
            problem = _exception_problem(item)
            if problem is not None:
                return f"{task_name!r}: {key}: {problem}"
    return None


def _queue_problem(task_name: str, options: dict[str, Any]) -> str | None:
    """A framework task's ``queue`` must be one its backend accepts (its ``TASKS[...]["QUEUES"]``)."""
    from .validation import validate_task_queue

    if "queue" not in options or task_name not in registry:
        return None
    try:
        validate_task_queue(task_name, options["queue"])
    except DistschedError as exc:
        return f"{task_name!r}: {exc}"
    return None


def _exception_problem(item: Any) -> str | None:
    if isinstance(item, type):
        return None if issubclass(item, BaseException) else f"{item.__qualname__} is not an exception class"
    if not isinstance(item, str):
        return f"{item!r} is not a dotted path to an exception class"
    try:
        _imported(item)
    except ImportError as exc:
        return f"cannot import {item!r} ({exc})"
    except (TypeError, ValueError):
        return f"{item!r} is not an exception class"
    return None


def problems() -> list[str]:
    """Every invalid entry of ``TASK_OPTIONS`` and of the registered tasks' ``@task`` options."""
    settings = conf.TASK_OPTIONS
    if not isinstance(settings, dict):
        return [f"must be a dict of task name -> options, not {type(settings).__name__}"]
    found = [p for name, opts in settings.items() if (p := options_problem(name, opts) or _queue_problem(name, opts))]
    for name in registry.names():
        entry = registry.get(name)
        if entry.options and (p := options_problem(name, entry.options)) is not None:
            found.append(f"(@task) {p}")
    return found
