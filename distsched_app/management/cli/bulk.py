"""``distsched run requeue|cancel --state ... --yes`` (every run matching a filter) and the ``bulk``
verbs that show and process bulk actions (``services.bulk``).

``run requeue|cancel`` with filter options and no run id counts the matching runs; without
``--yes`` (or with ``--dry-run``) that count is all it does. With ``--yes`` it creates the durable
job and follows it in the foreground: it processes the batches itself (a bar on a terminal), or
watches the worker that took the job first. Ctrl-C stops between batches and leaves the job
resumable: the workers go on with it, or ``distsched bulk process ID``. The actor recorded is
``cli:<os user>``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.core.management.base import CommandError

from ...clock import current_clock
from ...models import UNFINISHED_BULK_STATES, BulkAction, BulkKind, BulkState, Origin, RunState
from ...services import bulk, run_filters
from ..base import int_up_to, storable_text
from .args import whole_number
from .progress import Interrupted, ProgressBar, progress_bar
from .records import iso
from .schedule_changes import changed_by
from .tables import key_values, table

Output = tuple[Any, str]
POLL_SECONDS = 0.5  # while another processor holds the job: how often to look at its progress
MAX_LIST = 10_000
BATCH_HELP = "Runs per transaction while processing here (default %(default)s)."

# Option dest -> filter key (``services.run_filters``).
FILTER_OPTIONS = {
    "state": "state",
    "schedule": "schedule",
    "task": "task_name",
    "queue": "queue",
    "origin": "origin",
    "priority": "priority",
    "created_after": "created_after",
    "created_before": "created_before",
    "finished_after": "finished_after",
    "finished_before": "finished_before",
}


def add_filter_arguments(parser: Any) -> None:
    """The filter options of ``run requeue|cancel`` (without RUN_ID), and how to go about it."""
    parser.add_argument(
        "--state", action="append", choices=RunState.values, help="Only runs in this state (repeatable)."
    )
    parser.add_argument("--schedule", type=storable_text, metavar="NAME", help="Only runs of this schedule.")
    parser.add_argument("--task", type=storable_text, metavar="TASK", help="Only runs of this task.")
    parser.add_argument("--queue", type=storable_text, metavar="Q", help="Only runs on this queue.")
    parser.add_argument("--origin", choices=Origin.values, help="Only runs of this origin.")
    parser.add_argument("--priority", type=whole_number, metavar="N", help="Only runs of this priority.")
    for bound, text in (
        ("created-after", "Only runs created at or after ISO (with offset)."),
        ("created-before", "Only runs created before ISO."),
        ("finished-after", "Only runs finished at or after ISO."),
        ("finished-before", "Only runs finished before ISO."),
    ):
        parser.add_argument(f"--{bound}", metavar="ISO", help=text)
    parser.add_argument("--dry-run", action="store_true", help="Only count the matching runs.")
    parser.add_argument("--yes", action="store_true", help="Act on every matching run (a background job).")
    parser.add_argument(
        "--background", action="store_true", help="With --yes: create the job and return; the workers process it."
    )
    parser.add_argument("--batch-size", type=int_up_to(bulk.MAX_BATCH_SIZE), default=bulk.BATCH_SIZE, help=BATCH_HELP)


def add_arguments(groups: Any, leaf: Callable[..., Any]) -> None:
    """``distsched bulk list|show|cancel|process``."""
    group = groups.add_parser("bulk", help="Bulk actions on runs: list, show, cancel, process in the foreground.")
    verbs = group.add_subparsers(dest="verb", required=True)
    listing = leaf(verbs, "list", "Bulk actions, newest first, with their progress.")
    listing.add_argument("--limit", type=int_up_to(MAX_LIST), default=50, help="How many (default %(default)s).")
    show = leaf(verbs, "show", "One bulk action: its filter, who asked, progress.")
    show.add_argument("bulk_id", type=int, metavar="ID")
    stop = leaf(verbs, "cancel", "Stop a pending or running bulk action (what it did stays done).")
    stop.add_argument("bulk_id", type=int, metavar="ID")
    stop.add_argument("--reason", type=storable_text, metavar="TEXT", help="Why, for the action log.")
    process = leaf(verbs, "process", "Process unfinished bulk actions (or only ID) here, until none is left.")
    process.add_argument("bulk_id", type=int, metavar="ID", nargs="?")
    process.add_argument("--batch-size", type=int_up_to(bulk.MAX_BATCH_SIZE), default=bulk.BATCH_SIZE, help=BATCH_HELP)


# ---------------------------------------------------------------- documents


def bulk_record(job: BulkAction) -> dict[str, Any]:
    return {
        "id": job.pk,
        "action": job.action,
        "filter": job.filter,
        "state": job.state,
        "matched": job.matched,
        "done": job.done,
        "skipped": job.skipped,
        "batches": job.batches,
        "max_run_id": job.max_run_id,
        "cursor": job.cursor,
        "actor": job.actor,
        "source": job.source,
        "reason": job.reason,
        "error": job.error,
        "created_at": iso(job.created_at),
        "started_at": iso(job.started_at),
        "finished_at": iso(job.finished_at),
        "lease_owner": job.lease_owner,
        "lease_expires_at": iso(job.lease_expires_at),
    }


def summary(job: BulkAction) -> str:
    """``bulk action 7 (requeue state=dead): done, 1200 of 1200 matching run(s) requeued, 0 skipped``."""
    head = f"bulk action {job.pk} ({job.action} {run_filters.describe(job.filter)})"
    counts = f"{job.done} of {job.matched} matching run(s) {bulk.PAST[BulkKind(job.action)]}, {job.skipped} skipped"
    tail = f": {job.error}" if job.error else ""
    return f"{head}: {job.state}, {counts}{tail}"


# ---------------------------------------------------------------- run requeue|cancel by filter


def filter_of(o: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {key: o[opt] for opt, key in FILTER_OPTIONS.items() if o.get(opt) is not None}
    if len(found.get("state", ())) == 1:
        found["state"] = found["state"][0]  # --state given once: one state, as the API's filter names it
    return found


def refuse_filters(o: dict[str, Any]) -> None:
    """A RUN_ID names one run: filter options beside it would be ignored, so they are an error."""
    if filter_of(o) or o.get("dry_run") or o.get("background"):
        raise CommandError("give either a RUN_ID or filter options (--state, --schedule, ...), not both")


def run_bulk(action: str, now: datetime, o: dict[str, Any]) -> Output:
    found = filter_of(o)
    if not found:
        raise CommandError(
            f"give a RUN_ID, or a filter (--state, --schedule, --task, --queue, ...) to {action} every matching run"
        )
    if o["background"] and not o["yes"]:
        raise CommandError("--background needs --yes")
    if o["dry_run"] or not o["yes"]:
        count = bulk.preview(action=action, filter=found)
        document = {"action": action, "filter": count.filter, "dry_run": True, "count": count.count}
        text = f"would {action} {count.count} run(s) matching {run_filters.describe(count.filter)}"
        if o["dry_run"]:
            return document, text
        raise CommandError(f"{text}; add --yes to do it (a background job), or --dry-run to only count")
    job = bulk.create_bulk_action(action=action, filter=found, now=now, **changed_by(o))
    if o["background"] or job.state == BulkState.DONE:
        more = "" if job.state == BulkState.DONE else "; the workers process it (`distsched bulk show` follows it)"
        return bulk_record(job), summary(job) + more
    return follow(job, o)


def follow(job: BulkAction, o: dict[str, Any]) -> Output:
    """Process the job here (or watch whoever holds it) until it ends; Ctrl-C leaves it resumable."""
    bar = progress_bar(o.get("progress_stream"), desc=bulk.PAST[BulkKind(job.action)], unit="run")
    show = _shower(bar)
    clock, owner = current_clock(), bulk.default_owner()
    try:
        while job.state in UNFINISHED_BULK_STATES:
            bulk.process_bulk_actions(clock, owner=owner, job_id=job.pk, batch_size=o["batch_size"], progress=show)
            job = bulk.get_bulk_action(job.pk)
            show(job)
            if job.state in UNFINISHED_BULK_STATES:
                time.sleep(POLL_SECONDS)  # another processor holds the job: watch it
    except KeyboardInterrupt:
        job = bulk.get_bulk_action(job.pk)
        raise Interrupted(
            {**bulk_record(job), "interrupted": True},
            f"interrupted: {summary(job)} so far; the batch in progress was rolled back. The job is kept and "
            f"resumable: the workers go on with it, or run `distsched bulk process {job.pk}`",
        ) from None
    finally:
        if bar is not None:
            bar.close()
    return bulk_record(job), summary(job)


def _shower(bar: ProgressBar | None) -> Callable[[BulkAction], None]:
    def show(job: BulkAction) -> None:
        if bar is not None:
            bar.update(job.done + job.skipped, job.matched, f"{job.skipped} skipped")

    return show


# ---------------------------------------------------------------- bulk list|show|cancel|process


def bulk_list(now: datetime, o: dict[str, Any]) -> Output:
    found = list(bulk.list_bulk_actions()[: o["limit"]])
    rows = [
        (j.pk, j.action, run_filters.describe(j.filter), j.state, j.matched, j.done, j.skipped, j.actor, j.created_at)
        for j in found
    ]
    headers = ("ID", "ACTION", "FILTER", "STATE", "MATCHED", "DONE", "SKIPPED", "BY", "CREATED")
    return [bulk_record(j) for j in found], table(headers, rows, max_width=60) if rows else "no bulk actions"


def bulk_show(now: datetime, o: dict[str, Any]) -> Output:
    job = bulk.get_bulk_action(o["bulk_id"])
    document = bulk_record(job)
    pairs = [(k, v) for k, v in document.items() if k != "filter"]
    pairs.insert(2, ("filter", run_filters.describe(job.filter)))
    return document, key_values(pairs)


def bulk_cancel(now: datetime, o: dict[str, Any]) -> Output:
    job = bulk.stop_bulk_action(o["bulk_id"], now=now, **changed_by(o))
    return bulk_record(job), summary(job)


def bulk_process(now: datetime, o: dict[str, Any]) -> Output:
    if o["bulk_id"] is not None:
        return follow(bulk.get_bulk_action(o["bulk_id"]), o)
    try:
        done = bulk.process_bulk_actions(current_clock(), batch_size=o["batch_size"])
    except KeyboardInterrupt:
        raise Interrupted({"interrupted": True}, "interrupted: unfinished bulk actions stay resumable") from None
    return {"batches": done.batches}, f"processed {done.batches} batch(es); no unfinished bulk action is free"


VERBS: dict[str, Callable[[datetime, dict[str, Any]], Output]] = {
    "bulk list": bulk_list,
    "bulk show": bulk_show,
    "bulk cancel": bulk_cancel,
    "bulk process": bulk_process,
}
