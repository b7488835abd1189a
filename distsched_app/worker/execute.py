"""One task call: outside any transaction, capturing whatever the task returns or raises.

Nothing task code does escapes this module: a return value (however hostile)
becomes the attempt's ``result``, any exception (``SystemExit`` included, or
one whose ``str()`` raises) its ``error`` and ``tb``. What is stored, and how,
is the recorder's and the outcome services' business.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..clock import Clock
from ..context import RunContext
from ..errors import RunCancelled
from ..models import Run
from ..registry import TaskRegistry


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
    error: str = ""
    tb: str = ""
    result: Any = None

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


def call_task(
    attempt: Attempt, *, registry: TaskRegistry, context: RunContext, clock: Clock, cancelled_before_start: bool
) -> None:
    """Run the attempt's task and fill in its outcome; never raises.

    A prefetched run whose cancel was requested before it started is not
    called at all: it ends cancelled.
    """
    run = attempt.run
    attempt.started_at = clock.now()
    attempt.started_mono = time.monotonic()
    if cancelled_before_start and not attempt.started_recorded:
        attempt.failed, attempt.cancelled = True, True
        attempt.error = "cancel requested before the run started"
    else:
        try:
            entry = registry.get(run.task_name)
            kwargs = dict(run.kwargs)
            if entry.accepts_context:
                kwargs["context"] = context
            attempt.result = entry.func(*run.args, **kwargs)
        except RunCancelled as exc:
            attempt.failed, attempt.cancelled, attempt.error = True, True, describe_exception(exc)
        except BaseException as exc:  # noqa: BLE001 - SystemExit/KeyboardInterrupt from task code fail the run
            attempt.failed, attempt.error, attempt.tb = True, describe_exception(exc), format_traceback(exc)
    attempt.duration = time.monotonic() - attempt.started_mono
    attempt.finished_at = clock.now()
