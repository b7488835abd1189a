"""``manage.py distsched <group> <verb>``: the operator's command line.

    distsched schedule create|list|show|pause|resume|trigger
    distsched run list|show|cancel|requeue
    distsched worker list
    distsched stats
    distsched prune --older-than 30d

Every verb reads the clock once, calls the service layer and prints either a
table for humans or, with ``--json``, one JSON document and nothing else on
stdout. Typed errors become a one-line ``CommandError`` (exit 1); bad
arguments a one-line argparse error (exit 2). No scheduling rule lives here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.core.management.base import CommandError

from ...clock import current_clock
from ...errors import DistschedError, ValidationError
from ...models import CatchUp, Overlap, RunState
from ...services import maintenance, queries, runs, schedules, stats, workers
from ...text import storable
from ..base import DistschedCommand, int_up_to, positive_int, storable_text
from ..cli import records
from ..cli.args import duration, json_value, object_id
from ..cli.tables import key_values, seconds, table, when

Output = tuple[Any, str]  # (the --json document, the text for humans)
MAX_LIST = 10_000


class Command(DistschedCommand):
    help = "Operate distsched: schedules, runs, workers, stats and pruning. See `distsched <group> --help`."
    # Data commands skip the system checks (like dumpdata): faster, and stderr
    # carries nothing but the one error line. `manage.py check` still runs them.
    requires_system_checks: list[str] = []

    def add_command_arguments(self, parser: Any) -> None:
        # The base class made ``parser`` a OneLineParser; subparsers copy its class.
        groups = parser.add_subparsers(dest="group", metavar="{schedule,run,worker,stats,prune}", required=True)

        schedule = groups.add_parser("schedule", help="Create, inspect, pause, resume and trigger schedules.")
        verbs = schedule.add_subparsers(dest="verb", required=True)
        create = _leaf(verbs, "create", "Create a schedule (exactly one of --interval, --cron, --run-at).")
        create.add_argument("name", metavar="NAME", help="Unique slug, e.g. nightly-report.")
        create.add_argument("--task", required=True, help="Registered task name.")
        # dest "args" is reserved by BaseCommand.run_from_argv (positional arguments).
        create.add_argument(
            "--args",
            dest="task_args",
            type=json_value,
            metavar="JSON",
            help="Positional arguments of the task, a JSON list.",
        )
        create.add_argument(
            "--kwargs",
            dest="task_kwargs",
            type=json_value,
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
            help="skip: a slot becomes a skipped run while an earlier run is active.",
        )
        create.add_argument("--paused", action="store_true", help="Create it paused.")
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
            _leaf(verbs, verb, text).add_argument("name", metavar="NAME")

        run = groups.add_parser("run", help="List, inspect, cancel and requeue runs.")
        verbs = run.add_subparsers(dest="verb", required=True)
        listing = _leaf(verbs, "list", "List runs, newest first.")
        listing.add_argument("--state", choices=RunState.values)
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
            ("cancel", "Cancel a waiting run, or ask a running one to stop."),
            ("requeue", "Put a dead or cancelled run back to pending."),
        ):
            _leaf(verbs, verb, text).add_argument("run_id", type=object_id, metavar="RUN_ID")

        worker = groups.add_parser("worker", help="Inspect workers.")
        verbs = worker.add_subparsers(dest="verb", required=True)
        _leaf(verbs, "list", "List workers: liveness, heartbeat age, current run, clock skew.")

        _leaf(groups, "stats", "Run, schedule and worker figures.")
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
        prune.add_argument("--dry-run", action="store_true", help="Count what would be deleted; delete nothing.")

    def handle(self, *args: Any, **options: Any) -> None:
        now = current_clock().now()  # read once; every service below gets this instant
        key = options["group"] if options["group"] in ("stats", "prune") else f"{options['group']} {options['verb']}"
        try:
            document, text = VERBS[key](now, options)
        except DistschedError as exc:
            raise CommandError(storable(" ".join(str(exc).split()))) from None
        # Rows written before the storable-text rule may hold lone surrogates: escaped, never a crash.
        if options["json"]:
            self.stdout.write(storable(json.dumps(document, indent=2, ensure_ascii=False)))
        else:
            self.stdout.write(storable(text))


def _leaf(subparsers: Any, name: str, text: str) -> Any:
    parser = subparsers.add_parser(name, help=text, description=text)
    parser.add_argument("--json", action="store_true", help="Print JSON (for scripts) instead of a table.")
    return parser


# ---------------------------------------------------------------- schedules

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


def schedule_create(now: datetime, o: dict[str, Any]) -> Output:
    fields = {field: o[opt] for opt, field in CREATE_OPTIONS.items() if o[opt] is not None}
    if o["paused"]:
        fields["paused"] = True
    s = schedules.create_schedule(name=o["name"], task_name=o["task"], now=now, **fields)
    state = "paused" if s.paused else f"next run at {when(s.next_run_at)}"
    return records.schedule_record(s), f"created schedule {s.name}: {records.spec(s)}, task {s.task_name}, {state}"


def schedule_list(now: datetime, o: dict[str, Any]) -> Output:
    paused = True if o["paused_only"] else False if o["active_only"] else None
    found = schedules.list_schedules(paused=paused)
    rows = [
        (s.name, s.task_name, records.spec(s), s.next_run_at, s.paused, s.queue, s.catch_up, s.overlap) for s in found
    ]
    text = table(("NAME", "TASK", "SCHEDULE", "NEXT RUN", "PAUSED", "QUEUE", "CATCH-UP", "OVERLAP"), rows)
    return [records.schedule_record(s) for s in found], text if found else "no schedules"


def schedule_show(now: datetime, o: dict[str, Any]) -> Output:
    s = schedules.get_schedule(o["name"])
    try:
        upcoming, no_upcoming = schedules.upcoming_fire_times(s, 5), "none"
    except ValidationError as exc:  # a stored recurrence the validation now refuses
        upcoming, no_upcoming = [], f"none ({exc})"
    last = queries.last_run(s)
    document = records.schedule_record(s, upcoming=upcoming)
    document["last_run"] = (
        None
        if last is None
        else {
            "id": last.pk,
            "state": last.state,
            "scheduled_for": records.iso(last.scheduled_for),
            "finished_at": records.iso(last.finished_at),
        }
    )
    pairs = [
        ("name", s.name),
        ("task_name", s.task_name),
        ("args", json.dumps(s.args)),
        ("kwargs", json.dumps(s.kwargs)),
        ("schedule", records.spec(s)),
        ("run_at", s.run_at),
        ("start_at", s.start_at),
        ("next_run_at", s.next_run_at),
        ("paused", s.paused),
        ("queue", s.queue),
        ("max_attempts", s.max_attempts),
        ("retry", f"base {s.retry_base_seconds:g}s, max {s.retry_max_seconds:g}s, jitter {s.retry_jitter:g}"),
        ("catch_up", s.catch_up),
        ("overlap", s.overlap),
        ("created_at", s.created_at),
        ("updated_at", s.updated_at),
        ("upcoming", ", ".join(when(t) for t in upcoming) or no_upcoming),
        ("last_run", None if last is None else f"{last.pk} {last.state} (slot {when(last.scheduled_for)})"),
    ]
    return document, key_values(pairs)


def schedule_pause(now: datetime, o: dict[str, Any]) -> Output:
    s = schedules.pause_schedule(o["name"], now=now)
    return records.schedule_record(s), f"paused schedule {s.name}"


def schedule_resume(now: datetime, o: dict[str, Any]) -> Output:
    s = schedules.resume_schedule(o["name"], now=now)
    return records.schedule_record(s), f"resumed schedule {s.name}: next run at {when(s.next_run_at)}"


def schedule_trigger(now: datetime, o: dict[str, Any]) -> Output:
    r = schedules.trigger_schedule(o["name"], now=now, message="triggered from the command line")
    return records.run_record(r), f"created run {r.pk} of schedule {r.schedule.name} (manual, queue {r.queue})"


# --------------------------------------------------------------------- runs

RUN_COLUMNS = ("ID", "SCHEDULE", "TASK", "STATE", "ATTEMPTS", "QUEUE", "SCHEDULED FOR", "STARTED", "FINISHED")


def run_list(now: datetime, o: dict[str, Any]) -> Output:
    qs = queries.runs()
    if o["schedule"]:
        qs = qs.filter(schedule=schedules.get_schedule(o["schedule"]))  # an unknown name is an error, not []
    filters = {"state": o["state"], "task_name": o["task"], "queue": o["queue"]}
    qs = qs.filter(**{k: v for k, v in filters.items() if v is not None})
    found = list(qs.order_by("-id")[: o["limit"]])
    rows = [
        (
            r.pk,
            r.schedule_name,
            r.task_name,
            r.state,
            f"{r.attempts}/{r.max_attempts}",
            r.queue,
            r.scheduled_for,
            r.started_at,
            r.finished_at,
        )
        for r in found
    ]
    return [records.run_record(r) for r in found], table(RUN_COLUMNS, rows) if found else "no runs"


def run_show(now: datetime, o: dict[str, Any]) -> Output:
    r = runs.get_run(o["run_id"])
    events = list(queries.run_events(r.pk))
    document = {**records.run_record(r), "events": [records.event_record(e) for e in events]}
    pairs = [
        ("id", r.pk),
        ("schedule", r.schedule.name),
        ("task_name", r.task_name),
        ("args", json.dumps(r.args)),
        ("kwargs", json.dumps(r.kwargs)),
        ("state", r.state),
        ("queue", r.queue),
        ("origin", r.origin),
        ("scheduled_for", r.scheduled_for),
        ("available_at", r.available_at),
        ("attempts", f"{r.attempts}/{r.max_attempts}"),
        ("lease_owner", r.lease_owner),
        ("lease_expires_at", r.lease_expires_at),
        ("started_at", r.started_at),
        ("finished_at", r.finished_at),
        ("cancel_requested", r.cancel_requested),
        ("idempotency_key", r.idempotency_key),
        ("result", None if r.result is None else json.dumps(r.result)),
        ("created_at", r.created_at),
        ("updated_at", r.updated_at),
    ]
    parts = [key_values(pairs), "", "events:"]
    parts.append(
        table(
            ("AT", "EVENT", "ATTEMPT", "WORKER", "MESSAGE"),
            [(e.created_at, e.event_type, e.attempt, e.worker_id, e.message) for e in events],
            max_width=100,
        )
    )
    if r.last_error:
        parts += ["", "last error:", r.last_error]
    return document, "\n".join(parts)


def run_cancel(now: datetime, o: dict[str, Any]) -> Output:
    r = runs.cancel_run(o["run_id"], now=now, by="distsched command")
    text = (
        f"run {r.pk} cancelled"
        if r.state == RunState.CANCELLED
        else f"run {r.pk} is {r.state}: cancel requested (the task stops when it checks)"
    )
    return records.run_record(r), text


def run_requeue(now: datetime, o: dict[str, Any]) -> Output:
    r = runs.requeue_run(o["run_id"], now=now, by="distsched command")
    return records.run_record(r), (f"run {r.pk} requeued: pending, up to {r.max_attempts - r.attempts} more attempt(s)")


# ------------------------------------------------------ workers, stats, prune


def worker_list(now: datetime, o: dict[str, Any]) -> Output:
    document = [records.worker_record(w, now=now) for w in workers.list_workers()]
    rows = [
        (
            d["worker_id"],
            d["hostname"],
            d["pid"],
            ",".join(d["queues"]),
            d["status"],
            d["liveness"],
            seconds(d["heartbeat_age_seconds"]),
            d["current_run"],
            d["runs_executed"],
            seconds(d["clock_skew_seconds"]),
        )
        for d in document
    ]
    headers = (
        "WORKER",
        "HOST",
        "PID",
        "QUEUES",
        "STATUS",
        "LIVENESS",
        "HEARTBEAT AGE",
        "CURRENT RUN",
        "RUNS",
        "CLOCK SKEW",
    )
    return document, table(headers, rows) if rows else "no workers"


def show_stats(now: datetime, o: dict[str, Any]) -> Output:
    s = stats.stats(now=now)
    counts = ", ".join(f"{state} {n}" for state, n in s.runs_by_state.items())
    lines = [
        key_values(
            [
                ("runs", counts),
                ("schedules", f"{s.schedules_total} total, {s.schedules_paused} paused, {s.schedules_overdue} overdue"),
                ("workers", f"{s.workers_alive} alive, {s.workers_stale} stale, {s.workers_stopped} stopped"),
                ("mean duration (24h)", seconds(s.mean_duration_seconds)),
                ("failures (24h)", s.failures_last_24h),
                ("retries (24h)", s.retries_last_24h),
            ]
        )
    ]
    if s.recent_failures:
        lines += [
            "",
            "recent failures:",
            table(
                ("AT", "RUN", "TASK", "ATTEMPT", "MESSAGE"),
                [(f.at, f.run_id, f.task_name, f.attempt, f.message) for f in s.recent_failures],
                max_width=100,
            ),
        ]
    return s.as_dict(), "\n".join(lines)


def prune(now: datetime, o: dict[str, Any]) -> Output:
    r = maintenance.prune_runs(older_than=o["older_than"], now=now, batch_size=o["batch_size"], dry_run=o["dry_run"])
    document = {
        "runs": r.runs,
        "events": r.events,
        "workers": r.workers,
        "cutoff": records.iso(r.cutoff),
        "dry_run": r.dry_run,
        "batches": r.batches,
    }
    verb = "would delete" if r.dry_run else "deleted"
    return document, (
        f"{verb} {r.runs} run(s) finished before {when(r.cutoff)}, {r.events} event(s) "
        f"and {r.workers} worker(s) silent since then"
    )


VERBS: dict[str, Callable[[datetime, dict[str, Any]], Output]] = {
    "schedule create": schedule_create,
    "schedule list": schedule_list,
    "schedule show": schedule_show,
    "schedule pause": schedule_pause,
    "schedule resume": schedule_resume,
    "schedule trigger": schedule_trigger,
    "run list": run_list,
    "run show": run_show,
    "run cancel": run_cancel,
    "run requeue": run_requeue,
    "worker list": worker_list,
    "stats": show_stats,
    "prune": prune,
}
