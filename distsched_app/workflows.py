"""Workflows: runs that wait for other runs, with results passed by name.

    from distsched_app import workflows

    wf = workflows.enqueue({"name": "onboard", "nodes": [
        {"id": "fetch", "task": "fetch_account", "kwargs": {"account_id": 42}},
        {"id": "bill", "task": "sync_billing", "after": ["fetch"]},
        {"id": "mail", "task": "send_welcome", "after": ["fetch"], "queue": "mail"},
        {"id": "report", "task": "summarize", "after": ["bill", "mail"], "on_upstream_failure": "run"},
    ]})
    wf.id, wf.runs  # {"fetch": 101, "bill": 102, ...}

or, in code, ``Workflow("onboard").node("fetch", fetch_account, kwargs=...).node(...).enqueue()``.
A task reads its upstream nodes' results as ``context.upstream_results["fetch"]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .clock import Clock, current_clock
from .errors import UnknownTask
from .models import Workflow as WorkflowRow
from .registry import registry
from .services import audit, workflow_ops
from .services import workflows as service
from .services.workflows import Enqueued

__all__ = ["Enqueued", "Workflow", "cancel", "enqueue", "get"]


def enqueue(spec: dict[str, Any], *, clock: Clock | None = None, actor: str = audit.CODE) -> Enqueued:
    """Validate the spec whole and write the workflow, its runs and edges in one transaction (the
    caller's, if one is open). Returns ``.id`` and ``.runs`` ({node id: run id}). An invalid spec
    raises a ``DistschedError`` (``ValidationError``) and writes nothing."""
    return service.enqueue(spec, now=(clock or current_clock()).now(), actor=actor)


def get(workflow_id: int) -> WorkflowRow:
    """The workflow row (``state``, ``finished_at``); ``WorkflowNotFound`` if there is none."""
    return workflow_ops.get_workflow(workflow_id)


def cancel(workflow_id: int, *, clock: Clock | None = None, actor: str = audit.CODE, reason: str = "") -> WorkflowRow:
    """Cancel every unfinished node of the workflow."""
    return workflow_ops.cancel_workflow(workflow_id, now=(clock or current_clock()).now(), actor=actor, reason=reason)


def _task_name(task: Any) -> str:
    """A node's task: a registered name, a ``django.tasks`` Task, or a function registered with
    distsched's ``@task``."""
    if isinstance(task, str):
        return task
    if hasattr(task, "module_path") and hasattr(task, "func"):  # a django.tasks Task
        return registry.register_framework_task(task).name
    for name in registry.names():
        entry = registry.find(name)
        if entry is not None and entry.func is task:
            return name
    raise UnknownTask(f"{task!r} is not a registered task (decorate it with @task)", field="task")


class Workflow:
    """Builds the same spec as the dict form, node by node: ``Workflow(name).node(...)``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.nodes: list[dict[str, Any]] = []

    def node(
        self,
        id: str,
        task: Any,
        *,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        after: Sequence[str] = (),
        on_upstream_failure: str = "cancel",
        **options: Any,
    ) -> Workflow:
        """Add a node (``options``: queue, priority, max_attempts, retry_base_seconds,
        retry_max_seconds); returns the builder, so calls chain."""
        self.nodes.append(
            {
                "id": id, "task": _task_name(task), "args": list(args), "kwargs": dict(kwargs or {}),
                "after": list(after), "on_upstream_failure": on_upstream_failure, **options,
            }
        )  # fmt: skip
        return self

    def spec(self) -> dict[str, Any]:
        return {"name": self.name, "nodes": [dict(n) for n in self.nodes]}

    def enqueue(self, *, clock: Clock | None = None, actor: str = audit.CODE) -> Enqueued:
        return enqueue(self.spec(), clock=clock, actor=actor)
