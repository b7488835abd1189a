"""The ``workflow`` verbs of ``manage.py distsched``: list, show, cancel.

Like every verb (``verbs``), each reads its options and ``now``, calls the service layer
(``services.workflow_ops``) and returns ``(the --json document, the text for humans)``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from ...models import Workflow, WorkflowState
from ...services import workflow_ops
from ..base import int_up_to, storable_text
from .args import object_id
from .records import iso
from .schedule_changes import changed_by
from .tables import key_values, table

Output = tuple[Any, str]
MAX_LIST = 10_000


def add_arguments(groups: Any, leaf: Callable[[Any, str, str], Any]) -> None:
    """``distsched workflow list|show|cancel`` (``leaf`` adds ``--json``)."""
    group = groups.add_parser("workflow", help="List, inspect and cancel workflows.")
    verbs = group.add_subparsers(dest="verb", required=True)
    listing = leaf(verbs, "list", "List workflows, newest first.")
    listing.add_argument("--state", choices=WorkflowState.values)
    listing.add_argument("--name", type=storable_text, metavar="NAME", help="Exact name.")
    listing.add_argument(
        "--limit", type=int_up_to(MAX_LIST), default=50, help="How many workflows (default %(default)s)."
    )
    show = leaf(verbs, "show", "One workflow and its nodes: run, state, upstream nodes.")
    show.add_argument("workflow_id", type=object_id, metavar="WORKFLOW_ID")
    cancel = leaf(verbs, "cancel", "Cancel every unfinished node (running ones are asked to stop).")
    cancel.add_argument("workflow_id", type=object_id, metavar="WORKFLOW_ID")
    cancel.add_argument("--reason", type=storable_text, metavar="TEXT", help="Why, for the action log.")


def record(workflow: Workflow) -> dict[str, Any]:
    return {
        "id": workflow.pk,
        "name": workflow.name,
        "state": workflow.state,
        "created_at": iso(workflow.created_at),
        "finished_at": iso(workflow.finished_at) if workflow.finished_at else None,
        "created_by": workflow.created_by,
    }


def _detail(workflow: Workflow) -> Output:
    nodes = workflow_ops.nodes(workflow)
    document = {
        **record(workflow),
        "nodes": [
            {"id": n.id, "run": n.run, "state": n.state, "task": n.task, "after": list(n.after),
             "on_upstream_failure": n.on_upstream_failure, "ended_by": n.ended_by}
            for n in nodes
        ],
    }  # fmt: skip
    head = key_values(
        [
            ("id", workflow.pk),
            ("name", workflow.name),
            ("state", workflow.state),
            ("created_at", workflow.created_at),
            ("finished_at", workflow.finished_at),
            ("created_by", workflow.created_by),
        ]
    )
    rows = [(n.id, n.run, n.task, n.state, ", ".join(n.after), n.on_upstream_failure) for n in nodes]
    return document, head + "\n\n" + table(("NODE", "RUN", "TASK", "STATE", "AFTER", "ON FAILURE"), rows)


def workflow_list(now: datetime, o: dict[str, Any]) -> Output:
    found = list(workflow_ops.list_workflows(state=o["state"], name=o["name"])[: o["limit"]])
    rows = [(w.pk, w.name, w.state, w.created_at, w.finished_at) for w in found]
    text = table(("ID", "NAME", "STATE", "CREATED", "FINISHED"), rows) if found else "no workflows"
    return [record(w) for w in found], text


def workflow_show(now: datetime, o: dict[str, Any]) -> Output:
    return _detail(workflow_ops.get_workflow(o["workflow_id"]))


def workflow_cancel(now: datetime, o: dict[str, Any]) -> Output:
    return _detail(workflow_ops.cancel_workflow(o["workflow_id"], now=now, **changed_by(o)))


VERBS: dict[str, Callable[[datetime, dict[str, Any]], Output]] = {
    "workflow list": workflow_list,
    "workflow show": workflow_show,
    "workflow cancel": workflow_cancel,
}
