"""Runs as Django's task framework sees them: ``TaskResult``, ``TaskContext`` and its signals.

A run is the framework's task result: its id is the run id, its status maps
from the run's state, its attempts and errors come from the run's history
(one worker id per attempt, one ``TaskError`` per failed attempt). Used by the
backend (``enqueue``, ``get_result``) and by the worker (the context of a
``takes_context`` task, ``task_started`` and ``task_finished``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .context import RunContext
from .framework import InvalidTask, TaskContext, TaskError, TaskResult, TaskResultStatus, task_finished, task_started
from .models import Origin, Run, RunState
from .registry import TaskEntry
from .services.runs import AttemptHistory, attempt_history
from .text import UndecodableJSON

STATUS_OF_STATE: dict[str, Any] = {
    RunState.PENDING: TaskResultStatus.READY,
    RunState.LEASED: TaskResultStatus.READY,
    RunState.RETRYING: TaskResultStatus.READY,
    RunState.BLOCKED: TaskResultStatus.READY,  # held back by a limit: ready, waiting for a slot
    RunState.RUNNING: TaskResultStatus.RUNNING,
    RunState.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    RunState.DEAD: TaskResultStatus.FAILED,
    RunState.CANCELLED: TaskResultStatus.FAILED,
    RunState.SKIPPED: TaskResultStatus.FAILED,
}
FINAL_STATES = (RunState.SUCCEEDED, RunState.DEAD, RunState.CANCELLED, RunState.SKIPPED)


@dataclass(frozen=True, kw_only=True)
class DistschedTaskContext(TaskContext):
    """The framework's ``TaskContext`` (``task_result``, ``attempt``) plus distsched's extras:
    the idempotency key and fencing token of the run, and cooperative cancel."""

    run: RunContext = field(repr=False)

    @property
    def idempotency_key(self) -> str:
        return self.run.idempotency_key

    @property
    def fencing_token(self) -> str:
        return self.run.fencing_token

    @property
    def upstream_results(self) -> Any:
        """A workflow node's upstream results by node id (``RunContext.upstream_results``)."""
        return self.run.upstream_results

    def cancel_requested(self) -> bool:
        return self.run.cancel_requested()

    def raise_if_cancelled(self) -> None:
        self.run.raise_if_cancelled()


def task_of(entry: TaskEntry, run: Run, *, backend: str | None = None) -> Any:
    """The framework Task a run executes, with the run's own priority and queue (on ``backend``,
    an alias, when given).

    The framework refuses a Task on a queue its backend does not accept (``InvalidTaskError``).
    Schedules and enqueues are checked for that, but a run written before (or whose queue left
    ``QUEUES`` since) is seen on its task's declared queue instead: it still runs, sends its
    signals and has a result, rather than failing every attempt on its own description.
    """
    task = entry.framework_task
    wanted = {
        "priority": run.priority,
        "queue_name": run.queue,
        "backend": backend or task.backend,
        "run_after": run_after_of(run),
    }
    for changes in (wanted, {**wanted, "queue_name": task.queue_name}):
        if all(getattr(task, name) == value for name, value in changes.items()):
            return task
        try:
            return task.using(**changes)
        except InvalidTask:
            continue
    return task


def run_after_of(run: Run) -> datetime | None:
    """The ``run_after`` a run was enqueued with: its slot, when that is not the moment it was
    written (an enqueue without ``run_after`` is due at once). Retries move ``available_at`` only."""
    if run.origin != Origin.ENQUEUED or run.scheduled_for is None or run.scheduled_for == run.created_at:
        return None
    return run.scheduled_for


def _errors(history: AttemptHistory) -> list[Any]:
    return [TaskError(exception_class_path=path, traceback=tb) for path, tb in history.errors]


def build(
    run: Any,
    task: Any,
    *,
    history: AttemptHistory,
    status: Any = None,
    return_value: Any = None,
) -> Any:
    """A ``TaskResult`` for ``run`` (a Run, or anything that reads like one: ``pk``, ``state``,
    ``created_at``, ``finished_at``, ``args``, ``kwargs``, ``result``) as it is now
    (``status`` overrides the mapped one)."""
    status = status or STATUS_OF_STATE[run.state]
    result = TaskResult(
        task=task,
        id=str(run.pk),
        status=status,
        enqueued_at=run.created_at,
        started_at=history.first_started_at,
        finished_at=run.finished_at if status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED) else None,
        last_attempted_at=history.last_started_at,
        # Arguments too deep to decode (``UndecodableJSON``) are not the call's: none are shown.
        args=[] if isinstance(run.args, UndecodableJSON) else list(run.args),
        kwargs={} if isinstance(run.kwargs, UndecodableJSON) else dict(run.kwargs),
        backend=task.backend,
        errors=_errors(history),
        worker_ids=list(history.worker_ids),
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", return_value if return_value is not None else run.result)
    return result


def result_of(run: Run, task: Any) -> Any:
    """What ``get_result`` returns: the run and its whole history (one query for the history)."""
    return build(run, task, history=attempt_history(run.pk))


def enqueued(run: Any, task: Any) -> Any:
    """The result of a run just enqueued: nothing attempted yet."""
    return build(run, task, history=AttemptHistory.empty())


# -- the worker's side ----------------------------------------------------------------


def _history_so_far(run: Run, worker_id: str, started_at: datetime) -> AttemptHistory:
    """The attempts before this one (read only when there were any), plus this one."""
    earlier = attempt_history(run.pk, before_attempt=run.attempts) if run.attempts > 1 else AttemptHistory.empty()
    return earlier.with_attempt(worker_id, started_at)


def running(entry: TaskEntry, run: Run, *, worker_id: str, started_at: datetime) -> Any:
    """The ``TaskResult`` of the attempt now starting (status RUNNING, this worker counted)."""
    return build(
        run, task_of(entry, run), history=_history_so_far(run, worker_id, started_at), status=TaskResultStatus.RUNNING
    )


def context(entry: TaskEntry, run: Run, run_context: RunContext, *, started_at: datetime) -> DistschedTaskContext:
    return DistschedTaskContext(
        task_result=running(entry, run, worker_id=run_context.worker_id, started_at=started_at), run=run_context
    )


def send_started(entry: TaskEntry, run: Run, *, worker_id: str, started_at: datetime) -> None:
    result = running(entry, run, worker_id=worker_id, started_at=started_at)
    task_started.send(sender=_backend_class(result.task), task_result=result)


def send_finished(
    entry: TaskEntry,
    run: Run,
    *,
    state: str,
    worker_id: str,
    started_at: datetime,
    finished_at: datetime,
    result: Any = None,
    error: tuple[str, str] | None = None,
) -> None:
    """``task_finished`` once a run is final (a failed attempt that will be retried is not)."""
    if state not in FINAL_STATES:
        return
    history = _history_so_far(run, worker_id, started_at)
    if error is not None:
        history = history.with_error(*error)
    view = Run(
        pk=run.pk,
        state=state,
        created_at=run.created_at,
        finished_at=finished_at,
        args=run.args,
        kwargs=run.kwargs,
        result=result,
    )
    task_result = build(view, task_of(entry, run), history=history, return_value=result)
    task_finished.send(sender=_backend_class(task_result.task), task_result=task_result)


def _backend_class(task: Any) -> type:
    return type(task.get_backend())
