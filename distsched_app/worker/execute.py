"""One task call: outside any transaction, capturing whatever the task returns or raises.

Nothing task code does escapes this module: a return value (however hostile)
becomes the attempt's ``result``, any exception (``SystemExit`` included, or
one whose ``str()`` raises) its ``error`` and ``tb``. What is stored, and how,
is the recorder's and the outcome services' business.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
import traceback
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .. import framework, tracing
from ..clock import Clock
from ..context import RunContext
from ..errors import RunCancelled
from ..models import Run
from ..registry import TaskEntry, TaskRegistry
from ..services import task_options
from ..text import UndecodableJSON


@dataclass(frozen=True, kw_only=True)
class Execution:
    """What happened to one claimed run in this worker."""

    run_id: int
    attempt: int
    state: str | None  # the recorded state; None if the lease was lost or recording failed
    duration: float
    error: str = ""


@dataclass(kw_only=True)
class Attempt:
    """A run this worker holds, from claim until its outcome is recorded."""

    run: Run
    started_recorded: bool  # the ``started`` event is written (claimed as running, or marked so later)
    started_at: datetime | None = None
    started_mono: float = 0.0
    finished_at: datetime | None = None
    duration: float = 0.0
    failed: bool = False
    cancelled: bool = False
    final: bool = False  # the failure cannot be helped by a retry: the run ends dead now
    error: str = ""
    error_class: str = ""  # the exception's class path, e.g. "builtins.ValueError"
    error_type: type[BaseException] | None = None  # its class (a task's retry_on/give_up_on decide with it)
    tb: str = ""
    result: Any = None
    entry: TaskEntry | None = None  # the registered task, once looked up
    unknown: bool = False  # its task is not registered here: given back without using the attempt
    timed_out: bool = False  # the task outlived its ``timeout``: failed; its context reads cancel requested
    # What the task raised: re-raised around django.tasks' task_finished, whose receivers log
    # the failure with its traceback (``logger.exception``), as inside the handler.
    exception: BaseException | None = None

    @property
    def run_id(self) -> int:
        return self.run.pk

    @property
    def started(self) -> datetime:
        """When the task was called (set by ``call_task``)."""
        if self.started_at is None:
            raise RuntimeError(f"run {self.run_id} has not been executed")
        return self.started_at

    @property
    def finished(self) -> datetime:
        """When the task returned or raised (set by ``call_task``)."""
        if self.finished_at is None:
            raise RuntimeError(f"run {self.run_id} has not been executed")
        return self.finished_at

    @property
    def number(self) -> int:
        """The attempt number: the run's fencing token is ``"<run id>:<number>"``."""
        return self.run.attempts


def describe_exception(exc: BaseException) -> str:
    """``Type: message`` even for exceptions whose ``str()`` raises."""
    name = type(exc).__name__
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not break the worker
        text = "<unprintable exception>"
    return f"{name}: {text}" if text else name


def format_traceback(exc: BaseException) -> str:
    try:
        return "".join(traceback.format_exception(exc))
    except Exception:  # noqa: BLE001
        return f"<traceback unavailable for {type(exc).__name__}>"


def class_path(exc: BaseException) -> str:
    kind = type(exc)
    return f"{kind.__module__}.{kind.__qualname__}"


_loops = threading.local()


@contextmanager
def async_in_calling_thread() -> Iterator[None]:
    """Within the block, this thread awaits async tasks with asgiref's ``async_to_sync``: the ORM
    calls an async task makes (``await Model.objects.acount()``, ``sync_to_async``) then run back
    on this thread, with its database connection. The testing helpers use it: a test's open
    transaction (``TestCase``) is on that connection, and another thread's connection would not
    see its rows (PostgreSQL), or find the table locked (SQLite in memory)."""
    previous = getattr(_loops, "in_caller", False)
    _loops.in_caller = True
    try:
        yield
    finally:
        _loops.in_caller = previous


def async_in_caller() -> bool:
    """Whether this thread is inside ``async_in_calling_thread`` (or an async task it awaits)."""
    return bool(getattr(_loops, "in_caller", False))


async def _await(coroutine: Coroutine[Any, Any, Any]) -> Any:
    return await coroutine


def run_coroutine(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Await an async task's coroutine on this thread's own event loop (one per worker thread,
    kept between runs, so a loop is not built and torn down for every run), or, within
    ``async_in_calling_thread``, through ``async_to_sync``."""
    if async_in_caller():
        from asgiref.sync import async_to_sync

        return async_to_sync(_await)(coroutine)
    loop = getattr(_loops, "loop", None)
    if loop is None or loop.is_closed():
        loop = _loops.loop = asyncio.new_event_loop()
    return loop.run_until_complete(coroutine)


def call_task(
    attempt: Attempt,
    *,
    registry: TaskRegistry,
    context: RunContext,
    framework_context: Callable[[TaskEntry], Any],
    on_start: Callable[[TaskEntry], None],
    clock: Clock,
    cancelled_before_start: bool,
) -> None:
    """Run the attempt's task and fill in its outcome; never raises.

    Only a registered name runs (an unknown one is a failed attempt). A distsched
    task gets ``context=`` if it names that parameter; a django.tasks task with
    ``takes_context`` gets ``framework_context(entry)`` as its first argument.
    ``on_start(entry)`` runs just before the call (django.tasks' ``task_started``).
    A coroutine function (or one returning a coroutine) is awaited on the thread's
    event loop. A prefetched run whose cancel was requested before it started is
    not called at all: it ends cancelled.
    """
    run = attempt.run
    attempt.started_at = clock.now()
    attempt.started_mono = time.monotonic()
    with tracing.consumer(run.trace_context, lambda: _span(run, context)) as span:
        if cancelled_before_start and not attempt.started_recorded:
            attempt.failed, attempt.cancelled = True, True
            attempt.error = "cancel requested before the run started"
        elif (undecodable := _undecodable_payload(run)) is not None:
            attempt.failed, attempt.final, attempt.error = True, True, undecodable
        else:
            try:
                entry = attempt.entry = registry.get(run.task_name)
                on_start(entry)
                args = list(run.args)
                kwargs = dict(run.kwargs)
                if entry.accepts_context:
                    kwargs["context"] = context
                elif entry.takes_framework_context:
                    args.insert(0, framework_context(entry))
                timeout = task_options.timeout_of(entry.name, entry.options)
                if timeout is None:
                    result = entry.func(*args, **kwargs)
                    if inspect.iscoroutine(result):
                        result = run_coroutine(result)
                else:
                    result = call_with_timeout(attempt, entry.func, args, kwargs, timeout)
                if entry.framework_task is not None:
                    # As Django's reference backends: a return value that is not JSON fails the task
                    # (TypeError); tuples become lists. distsched's own tasks store a repr instead.
                    result = framework.normalize_json(result)
                attempt.result = result
            except RunCancelled as exc:
                attempt.failed, attempt.cancelled, attempt.error = True, True, describe_exception(exc)
                attempt.exception = exc
            except BaseException as exc:  # noqa: BLE001 - SystemExit/KeyboardInterrupt from task code fail the run
                attempt.failed, attempt.error, attempt.tb = True, describe_exception(exc), format_traceback(exc)
                attempt.exception = exc
                attempt.error_class = class_path(exc)
                # Raised by the task (not by looking it up): its retry_on/give_up_on apply.
                attempt.error_type = type(exc) if attempt.entry is not None else None
                span.fail(exc, error_class=attempt.error_class, error=attempt.error, tb=attempt.tb)
        span.set(
            "distsched.run.outcome", "cancelled" if attempt.cancelled else "failed" if attempt.failed else "succeeded"
        )
    attempt.duration = time.monotonic() - attempt.started_mono
    attempt.finished_at = clock.now()


class TaskTimeout(TimeoutError):
    """An attempt outlived its task's ``timeout`` option (a ``TimeoutError``: ``retry_on`` and
    ``give_up_on`` may name either)."""


def call_with_timeout(
    attempt: Attempt, func: Callable[..., Any], args: list[Any], kwargs: dict[str, Any], timeout: float
) -> Any:
    """Call a task that has a ``timeout`` (seconds); past it, raise ``TaskTimeout``.

    An async task is cancelled (``asyncio.wait_for``). A sync task cannot be stopped from
    outside in Python: it runs in a daemon thread of its own, and at the timeout this worker
    stops waiting for it, so the attempt fails (and is retried by the task's policy) and the slot
    is free again; the thread runs on until the function returns, its outcome discarded, and its
    ``context.cancel_requested()`` now reads True so a cooperative task can stop. Within
    ``async_in_calling_thread`` (``testing.drain``: one thread, the test's connection) a sync task
    runs inline and an attempt that took longer than its timeout is failed when it returns.
    """
    if inspect.iscoroutinefunction(func):
        return run_coroutine(_awaited_within(attempt, func(*args, **kwargs), timeout))
    if async_in_caller():
        started = time.monotonic()
        result = func(*args, **kwargs)
        if inspect.iscoroutine(result):
            return run_coroutine(_awaited_within(attempt, result, timeout))
        if time.monotonic() - started > timeout:
            attempt.timed_out = True
            raise TaskTimeout(_timeout_message(timeout))
        return result
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            value = func(*args, **kwargs)
            outcome["result"] = asyncio.run(value) if inspect.iscoroutine(value) else value
        except BaseException as exc:  # noqa: BLE001 - handed to the calling thread, which records it
            outcome["error"] = exc
        finally:
            from django.db import connections

            connections.close_all()  # this thread's own connections, opened by the task

    thread = threading.Thread(target=target, name=f"distsched-run-{attempt.run_id}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        attempt.timed_out = True
        raise TaskTimeout(_timeout_message(timeout) + "; the call goes on in a thread until it returns")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("result")


async def _awaited_within(attempt: Attempt, coroutine: Coroutine[Any, Any, Any], timeout: float) -> Any:
    try:
        return await asyncio.wait_for(coroutine, timeout)
    except TimeoutError:
        attempt.timed_out = True
        raise TaskTimeout(_timeout_message(timeout) + "; cancelled") from None


def _timeout_message(timeout: float) -> str:
    return f"the task took longer than its timeout of {timeout:g} s"


def _undecodable_payload(run: Run) -> str | None:
    """Why the run's stored arguments cannot be passed to its task, if they cannot (``UndecodableJSON``)."""
    for field in ("args", "kwargs"):
        value = getattr(run, field)
        if isinstance(value, UndecodableJSON):
            return f"{field} cannot be decoded: {value.reason}; the task was not called and no retry can help"
    return None


def _span(run: Run, context: RunContext) -> tuple[str, dict[str, str | int]]:
    """The execution span's name and attributes."""
    return f"run {run.task_name}", {
        "messaging.operation.type": "process",
        "messaging.destination.name": run.queue,
        "messaging.message.id": str(run.pk),
        "distsched.run.id": run.pk,
        "distsched.task": run.task_name,
        "distsched.run.attempt": run.attempts,
        "distsched.run.origin": run.origin,
        "distsched.worker.id": context.worker_id,
    }
