"""The task registry: the only way a stored ``task_name`` becomes code.

Runs name tasks by their registered name, never by a dotted import path, so
stored data can only ever execute functions that some installed app's
``tasks`` module registered with ``@task``.
"""

from __future__ import annotations

import inspect
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from .errors import DuplicateTask, UnknownTask

F = TypeVar("F", bound=Callable[..., Any])

TASK_NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,200}$")


@dataclass(frozen=True, kw_only=True)
class TaskEntry:
    """A registered task. ``framework_task`` is the ``django.tasks`` Task when the function was
    declared with the framework's ``@task`` (its name is then the function's module path)."""

    name: str
    func: Callable[..., Any]
    accepts_context: bool
    framework_task: Any = None
    # ``@task(name, max_attempts=..., retry_on=[...], queue=...)``: the task's own options
    # (``services.task_options``; DISTSCHED["TASK_OPTIONS"] wins over them, key by key).
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def takes_framework_context(self) -> bool:
        """A framework task with ``takes_context=True``: a ``TaskContext`` is its first argument."""
        return bool(self.framework_task is not None and self.framework_task.takes_context)


def _accepts_context(func: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return False
    # Only an explicit ``context`` parameter: a ``**kwargs`` task that forwards
    # its arguments elsewhere should not receive a surprise keyword.
    return any(p.name == "context" and p.kind is not inspect.Parameter.POSITIONAL_ONLY for p in params)


def _identity(func: Callable[..., Any]) -> tuple[str, str]:
    return (getattr(func, "__module__", ""), getattr(func, "__qualname__", repr(func)))


class TaskRegistry:
    """Name -> function. Re-registering the same function is harmless."""

    def __init__(self) -> None:
        self._tasks: dict[str, TaskEntry] = {}
        self._lock = threading.Lock()

    def register(
        self, name: str, func: Callable[..., Any], *, framework_task: Any = None, options: dict[str, Any] | None = None
    ) -> TaskEntry:
        if not isinstance(name, str) or not TASK_NAME_RE.match(name):
            raise DuplicateTask(f"invalid task name {name!r}: use 1-200 of A-Z a-z 0-9 _ . : -")
        with self._lock:
            existing = self._tasks.get(name)
            if existing is not None and _identity(existing.func) != _identity(func):
                raise DuplicateTask(f"task {name!r} is already registered by {existing.func!r}")
            if existing is not None and framework_task is None:
                framework_task = existing.framework_task  # the same function, also declared with @task
            if existing is not None and options is None:
                options = existing.options
            accepts = framework_task is None and _accepts_context(func)
            entry = TaskEntry(
                name=name, func=func, accepts_context=accepts, framework_task=framework_task, options=options or {}
            )
            self._tasks[name] = entry
            return entry

    def register_framework_task(self, task: Any) -> TaskEntry:
        """Register a ``django.tasks`` Task under its function's module path (its stored name)."""
        return self.register(task.module_path, task.func, framework_task=task)

    def unregister(self, name: str) -> None:
        with self._lock:
            self._tasks.pop(name, None)

    def get(self, name: str) -> TaskEntry:
        try:
            return self._tasks[name]
        except KeyError:
            raise UnknownTask(f"no task registered as {name!r}") from None

    def find(self, name: str) -> TaskEntry | None:
        return self._tasks.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def names(self) -> list[str]:
        return sorted(self._tasks)


registry = TaskRegistry()


# A task's options (``services.task_options`` says what each does).
TASK_OPTION_KEYS = (
    *("max_attempts", "retry_base_seconds", "retry_max_seconds", "retry_jitter"),
    *("retry_on", "give_up_on", "queue", "priority", "timeout"),
)


@overload
def task(name: F) -> F: ...
@overload
def task(name: str | None = None, **options: Any) -> Callable[[F], F]: ...


def task(name: Any = None, **options: Any) -> Any:
    """Register a function as a task: ``@task("send_summary")`` or bare ``@task``.

    A bare ``@task`` registers the function under ``module.qualname``. Keywords are the task's
    options (``max_attempts``, ``retry_base_seconds``, ``retry_max_seconds``, ``retry_jitter``,
    ``retry_on``, ``give_up_on``, ``queue``, ``priority``, ``timeout``: ``services.task_options``);
    ``DISTSCHED["TASK_OPTIONS"]`` wins over them. Their values are checked by the system check.
    """
    unknown = sorted(set(options) - set(TASK_OPTION_KEYS))
    if unknown:
        raise TypeError(f"unknown @task option(s): {', '.join(unknown)} (known: {', '.join(TASK_OPTION_KEYS)})")
    if callable(name):
        func = name
        registry.register(f"{func.__module__}.{func.__qualname__}", func)
        return func

    def decorator(func: F) -> F:
        registry.register(name or f"{func.__module__}.{func.__qualname__}", func, options=dict(options))
        return func

    return decorator
