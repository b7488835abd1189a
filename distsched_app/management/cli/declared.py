"""``distsched schedule apply``: make the database match the schedules declared in code.

    distsched schedule apply [--file PATH.json | --file module:ATTR] [--dry-run] [--delete-removed] [--json]

Without ``--file`` the declarations are ``DISTSCHED["SCHEDULES"]``. The rules are
``services.declared_schedules``'s. Exit 0 when every declaration was applied (or would be, with
``--dry-run``); 1, after printing the report, when one could not be.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from ...clock import current_clock
from ...errors import ValidationError
from ...services import declared_schedules as service
from ...services import queues
from . import sources
from .progress import Interrupted
from .tables import table

Output = tuple[Any, str]


class Incomplete(Interrupted):
    """The verb's report, with exit status 1: some of what it was asked could not be done."""

    status = 1


def add_arguments(verbs: Any, leaf: Callable[[Any, str, str], Any]) -> None:
    apply = leaf(
        verbs,
        "apply",
        "Create or update the schedules declared in DISTSCHED['SCHEDULES'] (or --file); pause those removed.",
    )
    apply.add_argument(
        "--file",
        metavar="PATH|module:ATTR",
        help="Declarations from a JSON file or a Python dict (module:ATTR) instead of DISTSCHED['SCHEDULES'].",
    )
    apply.add_argument("--dry-run", action="store_true", help="Say what would be done; change nothing.")
    apply.add_argument(
        "--delete-removed",
        action="store_true",
        help="Delete the schedules declared before and absent now (default: pause them).",
    )


def schedule_apply(now: datetime, o: dict[str, Any]) -> Output:
    if o.get("file"):
        declared, label = sources.load(o["file"], option="--file"), o["file"]
    else:
        declared, label = service.declared_in_settings(), "settings"
        if declared is None:
            raise ValidationError("DISTSCHED['SCHEDULES'] is not set: nothing is declared (or give --file)")
    report = service.apply_declared(
        current_clock(),
        declared,
        actor=queues.cli_actor(),
        source_label=label,
        prune="delete" if o.get("delete_removed") else "pause",
        dry_run=o.get("dry_run", False),
    )
    document = {
        "source": label,
        "dry_run": report.dry_run,
        "schedules": [outcome.as_dict() for outcome in report.outcomes],
        "summary": {a: report.count(a) for a in service.ACTIONS},
    }
    would = "would be " if report.dry_run else ""
    rows = [(o.name, f"{would}{o.action}" if o.action not in ("unchanged", "failed") else o.action, o.message or "-")
            for o in report.outcomes]  # fmt: skip
    head = f"{'dry run, nothing changed: ' if report.dry_run else ''}{label}: {report.summary()}"
    text = "\n".join([table(("SCHEDULE", "DONE", "WHAT"), rows, max_width=100), "", head]) if rows else head
    if report.count("failed"):
        raise Incomplete(document, text)
    return document, text


VERBS: dict[str, Callable[[datetime, dict[str, Any]], Output]] = {
    "schedule apply": schedule_apply,
}
