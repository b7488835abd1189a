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
from ..services import outcomes
from ..services.outcomes import storable_result
from .execute import Attempt, describe_exception

if TYPE_CHECKING:
    from . import Worker


def context(entry: TaskEntry, attempt: Attempt, run_context: RunContext) -> Any:
    from .. import task_results

    return task_results.context(entry, attempt.run, run_context, started_at=attempt.started)


def started(worker: Worker, entry: TaskEntry, attempt: Attempt) -> None:
    """Before a framework task is called: a prefetched run (still ``leased``) is marked ``running``
    with its ``started_at`` first, so its result reads RUNNING while it executes, as the framework
    promises; then ``task_started``."""
    if entry.framework_task is None:
        return
    from .. import task_results

    if not attempt.started_recorded:
        _mark_running(worker, attempt)

    try:
        task_results.send_started(entry, attempt.run, worker_id=worker.worker_id, started_at=attempt.started)
    except Exception as exc:  # noqa: BLE001 - a receiver's bug must not fail the run
        worker.log(logging.ERROR, "task_started receiver failed", run_id=attempt.run_id, error=describe_exception(exc))


def mark_batch_started(worker: Worker, attempts: list[Attempt]) -> None:
    """Before a prefetched batch runs: its framework runs still ``leased`` are marked running in
    one transaction (not one per run), so each reads RUNNING with a ``started_at`` while it
    executes; a run waiting behind the others in the batch reads so a little early (tasks are
    prefetched only while they take under 50 ms)."""
    waiting = [a for a in attempts if not a.started_recorded and _is_framework(worker, a.run.task_name)]
    if not waiting:
        return
    with worker.recorder.lock:  # the heartbeat marks prefetched runs too
        try:
            marked = outcomes.mark_many_running(
                worker_id=worker.worker_id, held={a.run_id: a.number for a in waiting}, now=worker.clock.now()
            )
        except Exception as exc:  # noqa: BLE001 - each run is marked when it starts instead
            worker.log(logging.WARNING, "could not mark runs as running", error=describe_exception(exc))
            return
        for attempt in waiting:
            if attempt.run_id in marked:
                attempt.started_recorded = True


def _is_framework(worker: Worker, task_name: str) -> bool:
    entry = worker.registry.find(task_name)
    return entry is not None and entry.framework_task is not None


def _mark_running(worker: Worker, attempt: Attempt) -> None:
    with worker.recorder.lock:  # the heartbeat marks prefetched runs too: one of them does it
        if attempt.started_recorded:
            return
        try:
            attempt.started_recorded = outcomes.mark_running(
                run_id=attempt.run_id,
                worker_id=worker.worker_id,
                attempt=attempt.number,
                started_at=attempt.started,
                now=worker.clock.now(),
            )
        except Exception as exc:  # noqa: BLE001 - the outcome records the start anyway
            worker.log(
                logging.WARNING, "could not mark run as running", run_id=attempt.run_id, error=describe_exception(exc)
            )


def finished(worker: Worker, attempt: Attempt, state: str | None) -> None:
    """After the outcome is recorded: ``task_finished`` if the run is now final."""
    entry = attempt.entry
    if entry is None or entry.framework_task is None or state is None:
        return

    error = (attempt.error_class, attempt.tb) if attempt.failed and attempt.error_class else None
    try:
        if attempt.failed and attempt.exception is not None:
            try:  # sent inside a handler of the task's exception: receivers log its traceback
                raise attempt.exception
            except BaseException:  # noqa: BLE001 - re-raised only to be handled here
                _send_finished(worker, entry, attempt, state, error)
        else:
            _send_finished(worker, entry, attempt, state, error)
    except Exception as exc:  # noqa: BLE001 - a receiver's bug must not fail the run
        worker.log(logging.ERROR, "task_finished receiver failed", run_id=attempt.run_id, error=describe_exception(exc))
    finally:
        attempt.exception = None  # its frames are not kept alive


def _send_finished(
    worker: Worker, entry: TaskEntry, attempt: Attempt, state: str, error: tuple[str, str] | None
) -> None:
    from .. import task_results

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
