"""``manage.py distsched <group> <verb>``: the operator's command line.

    distsched schedule create|list|show|update|pause|resume|trigger|delete|history|restore
    distsched run enqueue|list|show|cancel|requeue (one run, or --state ... --yes: every matching run)
    distsched bulk list|show|cancel|process
    distsched worker list
    distsched queue pause|resume|list|history
    distsched limit list|show|set|reset
    distsched import celery-beat
    distsched workflow list|show|cancel
    distsched stats
    distsched prune --older-than 30d [--audit-older-than 400d]
    distsched leader
    distsched migrate-status --from django-tasks-db|django-q2

Every verb reads the clock once, calls the service layer and prints either a
table for humans or, with ``--json``, one JSON document and nothing else on
stdout. Typed errors become a one-line ``CommandError`` (exit 1); bad
arguments a one-line argparse error (exit 2). No scheduling rule lives here.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError

from ...clock import current_clock
from ...errors import DistschedError
from ...models import CatchUp, Origin, Overlap, RunState
from ...services import maintenance
from ...text import storable
from ..base import DistschedCommand, fraction_up_to, int_up_to, positive_int, storable_text
from ..cli import bulk as bulk_verbs
from ..cli import celery_import, declared, schedule_changes
from ..cli import workflows as workflow_cli
from ..cli.args import duration, duration_or_seconds, json_payload, object_id, whole_number
from ..cli.progress import INTERRUPTED_STATUS, Interrupted
from ..cli.verbs import VERBS

MAX_LIST = 10_000


class Command(DistschedCommand):
    help = (
        "Operate distsched: schedules, runs, workers, queues, limits, workflows, bulk actions, stats, "
        "pruning and the leader. See `distsched <group> --help`."
    )
    # Data commands skip the system checks (like dumpdata): faster, and stderr
    # carries nothing but the one error line. `manage.py check` still runs them.
    requires_system_checks: list[str] = []

    def add_command_arguments(self, parser: Any) -> None:
        # The base class made ``parser`` a OneLineParser; subparsers copy its class.
        groups = parser.add_subparsers(
            dest="group",
            metavar="{schedule,run,worker,queue,limit,workflow,bulk,import,stats,prune,leader,migrate-status}",
            required=True,
        )

        schedule = groups.add_parser(
            "schedule", help="Create, inspect, change, pause, resume, trigger, delete and restore schedules."
        )
        verbs = schedule.add_subparsers(dest="verb", required=True)
        create = _leaf(verbs, "create", "Create a schedule (exactly one of --interval, --cron, --run-at).")
        create.add_argument("name", metavar="NAME", help="Unique slug, e.g. nightly-report.")
        create.add_argument("--task", required=True, help="Registered task name.")
        # dest "args" is reserved by BaseCommand.run_from_argv (positional arguments).
        create.add_argument(
            "--args",
            dest="task_args",
            type=json_payload("args"),
            metavar="JSON",
            help="Positional arguments of the task, a JSON list.",
        )
        create.add_argument(
            "--kwargs",
            dest="task_kwargs",
            type=json_payload("kwargs"),
            metavar="JSON",
            help="Keyword arguments of the task, a JSON object.",
        )
        kind = create.add_mutually_exclusive_group(required=True)
        kind.add_argument("--interval", type=positive_int, metavar="SECONDS", help="Run every SECONDS.")
        kind.add_argument("--cron", metavar="EXPR", help='Five-field cron expression, e.g. "0 3 * * *".')
        kind.add_argument("--run-at", metavar="ISO", help="Run once at this ISO 8601 time (with offset).")
        create.add_argument("--timezone", metavar="TZ", help="IANA zone the cron expression is read in.")
        create.add_argument("--start-at", metavar="ISO", help="First slot of an interval/cron schedule.")
        create.add_argument(
            "--max-attempts",
            type=positive_int,
            metavar="N",
            help="Attempts per run before it is dead (default: MAX_ATTEMPTS).",
        )
        create.add_argument("--queue", metavar="Q", help="Queue its runs go to (default: default).")
        create.add_argument("--catch-up", choices=CatchUp.values, help="Missed slots after downtime (default: one).")
        create.add_argument(
            "--overlap",
            choices=Overlap.values,
            help="skip: a slot becomes a skipped run while an earlier run is active; replace: the earlier "
            "run is cancelled (asked to stop if it runs) and the new one starts once it has ended.",
        )
        create.add_argument("--paused", action="store_true", help="Create it paused.")
        create.add_argument(
            "--if-absent",
            action="store_true",
            help="If a schedule of that name exists, say so and exit 0 without changing it (for deploy scripts).",
        )
        listing = _leaf(verbs, "list", "List schedules.")
        only = listing.add_mutually_exclusive_group()
        only.add_argument("--paused", dest="paused_only", action="store_true", help="Only paused schedules.")
        only.add_argument("--active", dest="active_only", action="store_true", help="Only active schedules.")
        for verb, text in (
            ("show", "Show one schedule, its next fire times and last run."),
            ("pause", "Stop generating runs (existing runs continue)."),
            ("resume", "Generate runs again (the catch-up policy applies)."),
            ("trigger", "Create one manual run now."),
        ):
            leaf = _leaf(verbs, verb, text)
            leaf.add_argument("name", metavar="NAME")
            if verb != "show":
                leaf.add_argument("--reason", type=storable_text, metavar="TEXT", help="Why, for the history.")
        schedule_changes.add_arguments(verbs, _leaf)
        declared.add_arguments(verbs, _leaf)

        run = groups.add_parser("run", help="Enqueue, list, inspect, cancel and requeue runs.")
        verbs = run.add_subparsers(dest="verb", required=True)
        enqueue = _leaf(verbs, "enqueue", "Enqueue one run of a registered task, without a schedule.")
        enqueue.add_argument("task", metavar="TASK", help="Registered task name (a framework task: its module path).")
        enqueue.add_argument(
            "--args",
            dest="task_args",
            type=json_payload("args"),
            metavar="JSON",
            help="Positional arguments, a JSON list.",
        )
        enqueue.add_argument(
            "--kwargs",
            dest="task_kwargs",
            type=json_payload("kwargs"),
            metavar="JSON",
            help="Keyword arguments, a JSON object.",
        )
        enqueue.add_argument("--run-after", metavar="ISO", help="Not before this ISO 8601 time (with offset).")
        enqueue.add_argument(
            "--priority",
            type=whole_number,
            metavar="N",
            help="-100..100, higher claimed first (default: the task's declared priority, else 0).",
        )
        enqueue.add_argument(
            "--queue", metavar="Q", help="Queue the run goes to (default: the task's declared queue, else default)."
        )
        enqueue.add_argument(
            "--unique-key",
            metavar="KEY",
            help="While an unfinished run holds KEY, enqueue nothing and show that run.",
        )
        listing = _leaf(verbs, "list", "List runs, newest first.")
        listing.add_argument("--state", choices=RunState.values)
        listing.add_argument("--origin", choices=Origin.values)
        listing.add_argument("--schedule", type=storable_text, metavar="NAME")
        listing.add_argument("--task", type=storable_text, metavar="TASK")
        listing.add_argument("--queue", type=storable_text, metavar="Q")
        listing.add_argument(
            "--limit",
            type=int_up_to(MAX_LIST),
            default=50,
            help=f"How many runs (default %(default)s, at most {MAX_LIST}).",
        )
        for verb, text in (
            ("show", "Show one run and its event history."),
            ("cancel", "Cancel a waiting run, or ask a running one to stop; or, with filter options instead of "
             "RUN_ID, every matching run (a background job)."),
            ("requeue", "Put a dead or cancelled run back to pending; or, with filter options instead of RUN_ID, "
             "every matching run (a background job)."),
        ):  # fmt: skip
            leaf = _leaf(verbs, verb, text)
            leaf.add_argument("run_id", type=object_id, metavar="RUN_ID", nargs=None if verb == "show" else "?")
            if verb != "show":
                leaf.add_argument("--reason", type=storable_text, metavar="TEXT", help="Why, for the action log.")
                bulk_verbs.add_filter_arguments(leaf)

        worker = groups.add_parser("worker", help="Inspect workers.")
        verbs = worker.add_subparsers(dest="verb", required=True)
        _leaf(verbs, "list", "List workers: liveness, heartbeat age, current run, clock skew.")

        queue = groups.add_parser("queue", help="Pause and resume queues; list them with their depth.")
        verbs = queue.add_subparsers(dest="verb", required=True)
        pause = _leaf(verbs, "pause", "Stop claims of the queue's runs (they wait; running runs carry on).")
        pause.add_argument("name", type=storable_text, metavar="NAME")
        pause.add_argument("--reason", type=storable_text, metavar="TEXT", help="Why, for whoever looks later.")
        resume = _leaf(verbs, "resume", "Let workers claim the queue's runs again.")
        resume.add_argument("name", type=storable_text, metavar="NAME")
        _leaf(
            verbs,
            "list",
            "Queues: runs by state, oldest waiting, last hour's start lag and throughput, workers, pause.",
        )
        history = _leaf(verbs, "history", "A queue's pauses and resumes, newest first.")
        history.add_argument("name", type=storable_text, metavar="NAME")
        history.add_argument(
            "--limit", type=int_up_to(MAX_LIST), default=50, help="How many entries (default %(default)s)."
        )

        limit = groups.add_parser("limit", help="See the limits of DISTSCHED['LIMITS'] and override them at runtime.")
        verbs = limit.add_subparsers(dest="verb", required=True)
        _leaf(verbs, "list", "Declared limits: effective numbers, runs in use, blocked, throttled, overridden.")
        show = _leaf(verbs, "show", "One limit: declared and effective numbers, override, partitions, history.")
        show.add_argument("name", type=storable_text, metavar="NAME")
        change = _leaf(
            verbs, "set", "Override a limit's numbers (replacing an earlier override) until --for ends or a reset."
        )
        change.add_argument("name", type=storable_text, metavar="NAME")
        for option, text in (
            ("--concurrency", "Runs of one partition at a time."),
            ("--total", "Runs of all partitions together."),
            ("--burst", "Starts a rate lets through at once."),
            ("--local", "Runs per worker."),
        ):
            change.add_argument(option, type=whole_number, metavar="N", help=text)
        change.add_argument("--rate", type=storable_text, metavar="RATE", help="Starts per period: 5/s, 100/m, 10/30s.")
        change.add_argument("--pause", action="store_true", help="Admit no run of the limit until reset or expiry.")
        change.add_argument("--reason", type=storable_text, metavar="TEXT", help="Why, for whoever looks later.")
        change.add_argument(
            "--for",
            dest="for_seconds",
            type=duration_or_seconds,
            metavar="DURATION",
            help="The override ends by itself after 30m, 2h, 90s or a number of seconds (default: until reset).",
        )
        reset = _leaf(verbs, "reset", "Back to the declared numbers (a limit without an override: nothing changes).")
        reset.add_argument("name", type=storable_text, metavar="NAME")
        reset.add_argument("--reason", type=storable_text, metavar="TEXT", help="Why, for whoever looks later.")

        bulk_verbs.add_arguments(groups, _leaf)
        celery_import.add_arguments(groups, _leaf)
        workflow_cli.add_arguments(groups, _leaf)

        _leaf(groups, "stats", "Run, schedule and worker figures.")
        migrate_status = _leaf(
            groups, "migrate-status", "What the task queue you migrate from still has to run (is it drained?)."
        )
        migrate_status.add_argument(
            "--from", dest="source", required=True, choices=["django-tasks-db", "django-q2"], help="The old task queue."
        )
        prune = _leaf(groups, "prune", "Delete finished runs, their events and old workers.")
        prune.add_argument(
            "--older-than",
            type=duration,
            required=True,
            metavar="AGE",
            help="Cutoff age: 30d, 12h, 90m, 45s or sums like 1d12h.",
        )
        prune.add_argument(
            "--batch-size",
            type=positive_int,
            default=maintenance.DEFAULT_BATCH_SIZE,
            help="Runs deleted per transaction (default %(default)s).",
        )
        prune.add_argument(
            "--pause",
            type=fraction_up_to(maintenance.MAX_PAUSE),
            default=maintenance.DEFAULT_PAUSE,
            metavar="RATIO",
            help="Rest after each batch, in times the batch took (default %(default)s: none); e.g. 0.5 gives the "
            "claims running beside a long prune a larger share of the database, for a slower prune.",
        )
        prune.add_argument("--dry-run", action="store_true", help="Count what would be deleted; delete nothing.")
        prune.add_argument(
            "--audit-older-than",
            type=duration,
            metavar="AGE",
            help="Also delete audit entries (schedule versions, the action log) older than AGE; without it the "
            "audit trail is kept.",
        )
        _leaf(groups, "leader", "Which ticker leads (ticks and runs the chores) now, by the database's clock.")

    def handle(self, *args: Any, **options: Any) -> None:
        now = current_clock().now()  # read once; every service below gets this instant
        group = options["group"]
        leaves = ("stats", "prune", "leader", "migrate-status")
        key = group if group in leaves else f"{group} {options['verb']}"
        # Long verbs draw their progress here when it is a terminal; never with --json.
        options["progress_stream"] = None if options["json"] else self.stderr
        interrupted, status = False, INTERRUPTED_STATUS
        try:
            document, text = VERBS[key](now, options)
        except DistschedError as exc:
            raise CommandError(storable(" ".join(str(exc).split()))) from None
        except Interrupted as stop:  # Ctrl-C: what was done is the output, then exit 130
            document, text, interrupted = stop.document, stop.text, True
            status = getattr(stop, "status", INTERRUPTED_STATUS)  # 1: done in part (declared.Incomplete)
        # Rows written before the storable-text rule may hold lone surrogates: escaped, never a crash.
        if options["json"]:
            self.stdout.write(storable(json.dumps(document, indent=2, ensure_ascii=False)))
        else:
            self.stdout.write(storable(text))
        if interrupted:
            raise SystemExit(status)


def _leaf(subparsers: Any, name: str, text: str) -> Any:
    parser = subparsers.add_parser(name, help=text, description=text)
    parser.add_argument("--json", action="store_true", help="Print JSON (for scripts) instead of a table.")
    return parser
