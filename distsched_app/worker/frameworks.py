"""Where the worker meets Django's task framework: a task declared with ``django.tasks``' ``@task``
gets its ``TaskContext``, and ``task_started`` / ``task_finished`` are sent around it.

Only framework tasks pay for this; distsched's own ``@task`` functions skip it. A
signal receiver that raises is logged and does not change the run's outcome.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..context import RunContext
from ..registry import TaskEntry
from ..services.outcomes import storable_result
from .execute import Attempt, describe_exception

if TYPE_CHECKING:
    from . import Worker


def context(entry: TaskEntry, attempt: Attempt, run_context: RunContext) -> Any:
    from .. import task_results

    return task_results.context(entry, attempt.run, run_context, started_at=attempt.started)


def started(worker: Worker, entry: TaskEntry, attempt: Attempt) -> None:
    if entry.framework_task is None:
        return
    from .. import task_results

    try:
        task_results.send_started(entry, attempt.run, worker_id=worker.worker_id, started_at=attempt.started)
    except Exception as exc:  # noqa: BLE001 - a receiver's bug must not fail the run
        worker.log(logging.ERROR, "task_started receiver failed", run_id=attempt.run_id, error=describe_exception(exc))


def finished(worker: Worker, attempt: Attempt, state: str | None) -> None:
    """After the outcome is recorded: ``task_finished`` if the run is now final."""
    entry = attempt.entry
    if entry is None or entry.framework_task is None or state is None:
        return
    from .. import task_results

    error = (attempt.error_class, attempt.tb) if attempt.failed and attempt.error_class else None
    try:
        task_results.send_finished(
            entry,
            attempt.run,
            state=state,
            worker_id=worker.worker_id,
            started_at=attempt.started,
            finished_at=attempt.finished,
            result=storable_result(attempt.result) if not attempt.failed else None,
            error=error,
        )
    except Exception as exc:  # noqa: BLE001 - a receiver's bug must not fail the run
        worker.log(logging.ERROR, "task_finished receiver failed", run_id=attempt.run_id, error=describe_exception(exc))
