"""The ``schedule`` verbs that change or read a schedule's versions: update, delete, history, restore.

Like every verb (``verbs``), each reads its options and ``now``, calls ``services.schedules`` or
``services.audit`` and returns ``(the --json document, the text for humans)``. The actor recorded
is ``cli:<os user>``, the source ``cli``. ``add_arguments`` declares their options (the command
calls it next to the other schedule verbs).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.core.management.base import CommandError

from ...models import AuditEntry, AuditSource, CatchUp, Overlap
from ...services import audit, queues, schedules
from ..base import int_up_to, positive_int, storable_text
from .args import json_payload
from .records import iso, schedule_record, spec
from .tables import table, when

Output = tuple[Any, str]
MAX_HISTORY = 10_000

# Option dest -> schedule field of ``schedule create``; ``schedule update`` also takes ``--task``.
CREATE_OPTIONS = {
    "task_args": "args",
    "task_kwargs": "kwargs",
    "interval": "interval_seconds",
    "cron": "cron",
    "run_at": "run_at",
    "timezone": "timezone",
    "start_at": "start_at",
    "max_attempts": "max_attempts",
    "queue": "queue",
    "catch_up": "catch_up",
    "overlap": "overlap",
}
UPDATE_OPTIONS = {"task": "task_name", **CREATE_OPTIONS}


def changed_by(o: dict[str, Any]) -> dict[str, str]:
    """The ``actor``, ``source`` and ``reason`` keywords of a change from the command line."""
    return {"actor": queues.cli_actor(), "source": AuditSource.CLI, "reason": o.get("reason") or ""}


def add_arguments(verbs: Any, leaf: Callable[[Any, str, str], Any]) -> None:
    """The options of ``schedule update|delete|history|restore`` (``leaf`` adds ``--json``)."""
    update = leaf(verbs, "update", "Change a schedule's fields (a changed recurrence restarts from now).")
    update.add_argument("name", type=storable_text, metavar="NAME")
    update.add_argument("--task", type=storable_text, metavar="TASK", help="Registered task name.")
    update.add_argument(
        "--args", dest="task_args", type=json_payload("args"), metavar="JSON", help="Positional arguments, a JSON list."
    )
    update.add_argument(
        "--kwargs",
        dest="task_kwargs",
        type=json_payload("kwargs"),
        metavar="JSON",
        help="Keyword arguments, a JSON object.",
    )
    kind = update.add_mutually_exclusive_group()
    kind.add_argument("--interval", type=positive_int, metavar="SECONDS", help="Run every SECONDS.")
    kind.add_argument("--cron", type=storable_text, metavar="EXPR", help='Five-field cron expression, "0 3 * * *".')
    kind.add_argument("--run-at", type=storable_text, metavar="ISO", help="Run once at this ISO 8601 time.")
    update.add_argument("--timezone", type=storable_text, metavar="TZ", help="IANA zone of the cron expression.")
    update.add_argument(
        "--start-at", type=storable_text, metavar="ISO", help="First slot of an interval/cron schedule."
    )
    update.add_argument("--max-attempts", type=positive_int, metavar="N", help="Attempts per run before it is dead.")
    update.add_argument("--queue", type=storable_text, metavar="Q", help="Queue its runs go to.")
    update.add_argument("--catch-up", choices=CatchUp.values, help="Missed slots after downtime.")
    update.add_argument("--overlap", choices=Overlap.values, help="When a slot comes while an earlier run is active.")
    _versioned(update)

    delete = leaf(verbs, "delete", "Delete a schedule; its runs and their history are kept (needs --yes).")
    delete.add_argument("name", type=storable_text, metavar="NAME")
    delete.add_argument("--yes", action="store_true", help="Really delete it.")
    _reason(delete)

    history = leaf(verbs, "history", "A schedule's versions and actions, newest first (also once it is deleted).")
    history.add_argument("name", type=storable_text, metavar="NAME")
    history.add_argument(
        "--limit", type=int_up_to(MAX_HISTORY), default=50, help="How many entries (default %(default)s)."
    )

    restore = leaf(verbs, "restore", "Bring back a version's configuration as a new version (paused stays as is).")
    restore.add_argument("name", type=storable_text, metavar="NAME")
    restore.add_argument("version", type=positive_int, metavar="VERSION")
    _versioned(restore)


def _reason(parser: Any) -> None:
    parser.add_argument("--reason", type=storable_text, metavar="TEXT", help="Why, for whoever reads the history.")


def _versioned(parser: Any) -> None:
    parser.add_argument(
        "--expected-version",
        type=positive_int,
        metavar="N",
        help="Refuse if the schedule is at another version by now (someone changed it since you read it).",
    )
    _reason(parser)


# ---------------------------------------------------------------- records


def entry_record(entry: AuditEntry) -> dict[str, Any]:
    """An entry as ``--json`` gives it, named as ``GET /api/schedules/{name}/history`` does."""
    data = entry.data or {}
    return {
        "id": entry.pk,
        "version": entry.version,
        "at": iso(entry.created_at),
        "action": entry.action,
        "actor": entry.actor,
        "source": entry.source,
        "reason": entry.reason,
        "changes": entry.changes,
        "snapshot": entry.snapshot,
        "run": data.get("run"),
        "restored": data.get("restored"),
    }


# ---------------------------------------------------------------- verbs


def schedule_update(now: datetime, o: dict[str, Any]) -> Output:
    fields = {field: o[opt] for opt, field in UPDATE_OPTIONS.items() if o.get(opt) is not None}
    if not fields:
        raise CommandError("give at least one field to change (see `distsched schedule update --help`)")
    before = schedules.get_schedule(o["name"]).version
    s = schedules.update_schedule(o["name"], now=now, expected_version=o["expected_version"], **changed_by(o), **fields)
    text = (
        f"schedule {s.name} is now version {s.version}: {spec(s)}, task {s.task_name}"
        if s.version != before
        else f"schedule {s.name} already had these values: nothing changed (version {s.version})"
    )
    return schedule_record(s), text


def schedule_delete(now: datetime, o: dict[str, Any]) -> Output:
    if not o["yes"]:
        raise CommandError(
            f"refusing to delete schedule {o['name']} without --yes (its runs and history would be kept)"
        )
    kept = schedules.delete_schedule(o["name"], now=now, **changed_by(o))
    document = {"name": o["name"], "deleted": True, "runs_kept": kept}
    return document, f"deleted schedule {o['name']}; its {kept} run(s) and their history are kept"


def schedule_history(now: datetime, o: dict[str, Any]) -> Output:
    found = list(audit.schedule_history(o["name"])[: o["limit"]])
    rows = [(e.version, e.created_at, e.action, e.actor, e.source, e.reason, audit.describe(e)) for e in found]
    headers = ("VERSION", "AT", "ACTION", "BY", "SOURCE", "REASON", "WHAT")
    return [entry_record(e) for e in found], table(headers, rows, max_width=100)


def schedule_restore(now: datetime, o: dict[str, Any]) -> Output:
    s = schedules.restore_schedule(
        o["name"], o["version"], now=now, expected_version=o["expected_version"], **changed_by(o)
    )
    text = f"schedule {s.name} is now version {s.version}, with version {o['version']}'s configuration: {spec(s)}"
    return schedule_record(s), text


def with_audit_pruned(now: datetime, o: dict[str, Any], document: dict[str, Any], text: str) -> Output:
    """``prune --audit-older-than AGE``: also the audit entries older than AGE (the trail is
    otherwise kept, whatever ``--older-than`` says)."""
    age = o.get("audit_older_than")
    if age is None:
        return document, text
    n = audit.prune_entries(older_than=age, now=now, dry_run=o["dry_run"])
    verb = "would delete" if o["dry_run"] else "deleted"
    text = f"{text}; {verb} {n} audit entr{'y' if n == 1 else 'ies'} from before {when(now - age)}"
    return {**document, "audit_entries": n}, text


VERBS: dict[str, Callable[[datetime, dict[str, Any]], Output]] = {
    "schedule update": schedule_update,
    "schedule delete": schedule_delete,
    "schedule history": schedule_history,
    "schedule restore": schedule_restore,
}
