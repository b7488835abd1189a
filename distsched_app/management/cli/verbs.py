"""The verbs of ``manage.py distsched``: each reads nothing but its options and ``now``,
calls the service layer, and returns ``(the --json document, the text for humans)``.

The command (``management/commands/distsched.py``) parses the arguments, reads the
clock once and prints what a verb returns; ``VERBS`` maps ``"group verb"`` to its function.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from ...errors import DuplicateName, ScheduleNotFound, ValidationError
from ...models import Run, RunState, Schedule, schedule_name_of
from ...services import enqueue, explain, maintenance, migration_status, queries, runs, schedules, stats, workers
from . import bulk as bulk_verbs
from . import celery_import, declared, records, schedule_changes
from . import leader as leader_verbs
from . import limits as limit_verbs
from . import queues as queue_verbs
from . import workflows as workflow_verbs
from .progress import Interrupted, ProgressBar, progress_bar
from .schedule_changes import CREATE_OPTIONS, changed_by
from .tables import key_values, seconds, table, when

Output = tuple[Any, str]  # (the --json document, the text for humans)


# ---------------------------------------------------------------- schedules


def schedule_create(now: datetime, o: dict[str, Any]) -> Output:
    fields = {field: o[opt] for opt, field in CREATE_OPTIONS.items() if o[opt] is not None}
    if o["paused"]:
        fields["paused"] = True
    existing = _existing_schedule(o["name"]) if o.get("if_absent") else None
    if existing is None:
        try:
            s = schedules.create_schedule(name=o["name"], task_name=o["task"], now=now, **changed_by(o), **fields)
        except DuplicateName:
            if not o.get("if_absent"):
                raise
            existing = schedules.get_schedule(o["name"])  # another creator won the race for the name
    if existing is not None:
        return {**records.schedule_record(existing), "created": False}, (
            f"schedule {existing.name} exists ({records.spec(existing)}, task {existing.task_name}): nothing changed"
        )
    state = "paused" if s.paused else f"next run at {when(s.next_run_at)}"
    text = f"created schedule {s.name}: {records.spec(s)}, task {s.task_name}, {state}"
    return {**records.schedule_record(s), "created": True}, text


def _existing_schedule(name: str) -> Schedule | None:
    """--if-absent looks before validating: a repeated deploy script passes even when its
    options no longer validate (a --run-at now past). The unique name still decides a race."""
    try:
        return schedules.get_schedule(name)
    except ScheduleNotFound:
        return None


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
    s = schedules.pause_schedule(o["name"], now=now, **changed_by(o))
    return records.schedule_record(s), f"paused schedule {s.name}"


def schedule_resume(now: datetime, o: dict[str, Any]) -> Output:
    s = schedules.resume_schedule(o["name"], now=now, **changed_by(o))
    return records.schedule_record(s), f"resumed schedule {s.name}: next run at {when(s.next_run_at)}"


def schedule_trigger(now: datetime, o: dict[str, Any]) -> Output:
    r = schedules.trigger_schedule(o["name"], now=now, message="triggered from the command line", **changed_by(o))
    return records.run_record(r), f"created run {r.pk} of schedule {o['name']} (manual, queue {r.queue})"


# --------------------------------------------------------------------- runs

RUN_COLUMNS = (
    "ID",
    "SCHEDULE",
    "TASK",
    "STATE",
    "ATTEMPTS",
    "QUEUE",
    "PRIORITY",
    "SCHEDULED FOR",
    "STARTED",
    "FINISHED",
)


def run_enqueue(now: datetime, o: dict[str, Any]) -> Output:
    options = {"args": o["task_args"], "kwargs": o["task_kwargs"], "run_after": o["run_after"]}
    options |= {"priority": o["priority"], "queue": o["queue"], "unique_key": o["unique_key"]}
    done = enqueue.enqueue_declared(
        task_name=o["task"], now=now, message="enqueued from the command line",
        **{k: v for k, v in options.items() if v is not None},
    )  # fmt: skip
    r = done.run
    document = {**records.run_record(r), "created": done.created}
    if not done.created:
        return document, f"run {r.pk} holds unique key {r.unique_key!r} and is {r.state}: nothing enqueued"
    text = f"created run {r.pk} of task {r.task_name} (enqueued, queue {r.queue}, priority {r.priority})"
    return document, text if r.available_at <= now else f"{text}, not before {when(r.available_at)}"


def run_list(now: datetime, o: dict[str, Any]) -> Output:
    qs = queries.runs()
    if o["schedule"]:
        qs = qs.filter(schedule=schedules.get_schedule(o["schedule"]))  # an unknown name is an error, not []
    filters = {"state": o["state"], "task_name": o["task"], "queue": o["queue"], "origin": o["origin"]}
    qs = qs.filter(**{k: v for k, v in filters.items() if v is not None})
    found = list(qs.order_by("-id")[: o["limit"]])
    rows = [
        (
            r.pk,
            getattr(r, "schedule_name", None),  # annotated by queries.runs(); None (shown "-") when enqueued
            r.task_name,
            r.state,
            f"{r.attempts}/{r.max_attempts}",
            r.queue,
            r.priority,
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
    why = explain.explain(r, now=now)
    document = {**records.run_record(r), "events": [records.event_record(e) for e in events], "explain": why}
    pairs = [
        ("id", r.pk),
        ("schedule", schedule_name_of(r)),
        ("task_name", r.task_name),
        ("args", json.dumps(r.args)),
        ("kwargs", json.dumps(r.kwargs)),
        ("state", r.state),
        ("queue", r.queue),
        ("priority", r.priority),
        ("origin", r.origin),
        ("unique_key", r.unique_key),
        ("retry_policy", _policy_text(r)),
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
    parts = [key_values(pairs)]
    if why["waiting_for"]:
        parts += ["", "waiting for:", *(f"  - {reason['message']}" for reason in why["waiting_for"])]
    parts += ["", "events:"]
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


def _policy_text(r: Run) -> str:
    """An enqueued run's own retry policy in one line; else where its policy comes from."""
    policy = records.retry_policy(r)
    if policy is None:
        return "the schedule's" if r.schedule_id is not None else "DISTSCHED's defaults"
    return (
        f"{policy['max_attempts']} attempt(s), base {policy['retry_base_seconds']:g}s, "
        f"max {policy['retry_max_seconds']:g}s, jitter {policy['retry_jitter']:g}"
    )


def run_cancel(now: datetime, o: dict[str, Any]) -> Output:
    if o.get("run_id") is None:  # no RUN_ID: every run matching the filter options
        return bulk_verbs.run_bulk("cancel", now, o)
    bulk_verbs.refuse_filters(o)
    r = runs.cancel_run(o["run_id"], now=now, **changed_by(o))
    text = (
        f"run {r.pk} cancelled"
        if r.state == RunState.CANCELLED
        else f"run {r.pk} is {r.state}: cancel requested (the task stops when it checks)"
    )
    return records.run_record(r), text


def run_requeue(now: datetime, o: dict[str, Any]) -> Output:
    if o.get("run_id") is None:  # no RUN_ID: every run matching the filter options
        return bulk_verbs.run_bulk("requeue", now, o)
    bulk_verbs.refuse_filters(o)
    r = runs.requeue_run(o["run_id"], now=now, **changed_by(o))
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
            ",".join(d["capabilities"]) or "-",
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
        "CAPABILITIES",
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
    """A bar with rate and ETA on a terminal (``progress_stream``: the command's stderr, None
    with ``--json``); Ctrl-C stops it between batches, saying what the committed ones deleted."""
    bar = None if o["dry_run"] else progress_bar(o.get("progress_stream"), desc="pruning", unit="run")
    try:
        r = maintenance.prune_runs(
            older_than=o["older_than"],
            now=now,
            batch_size=o["batch_size"],
            dry_run=o["dry_run"],
            pause=o.get("pause", maintenance.DEFAULT_PAUSE),
            progress=None if bar is None else _show_prune(bar),
        )
    except maintenance.PruneInterrupted as stop:
        raise Interrupted(*_pruned(stop.done, interrupted=True)) from None
    finally:
        if bar is not None:
            bar.close()  # before the summary line, so the two never share a line
    return schedule_changes.with_audit_pruned(now, o, *_pruned(r, interrupted=False))


def _show_prune(bar: ProgressBar) -> Callable[[maintenance.PruneProgress], None]:
    return lambda p: bar.update(p.runs, p.total, f"{p.events} events")


def _pruned(r: maintenance.PruneResult, *, interrupted: bool) -> Output:
    document = {
        "runs": r.runs,
        "events": r.events,
        "workers": r.workers,
        "cutoff": records.iso(r.cutoff),
        "dry_run": r.dry_run,
        "batches": r.batches,
        "interrupted": interrupted,
        "workflows": r.workflows,  # finished workflows deleted whole (their runs and events are counted above)
    }
    if interrupted:
        return document, (
            f"interrupted: deleted {r.runs} run(s) finished before {when(r.cutoff)} and {r.events} event(s) "
            f"in {r.batches} batch(es); the batch in progress was rolled back and no worker was deleted; "
            "run it again to go on"
        )
    verb = "would delete" if r.dry_run else "deleted"
    return document, (
        f"{verb} {r.runs} run(s) finished before {when(r.cutoff)}, {r.events} event(s) "
        f"and {r.workers} worker(s) silent since then"
        + (f" ({r.workflows} finished workflow(s) whole)" if r.workflows else "")
    )


def migrate_status(now: datetime, o: dict[str, Any]) -> Output:
    status = migration_status.old_queue_status(o["source"], now=now)
    return status.as_dict(), migration_status.describe(status)


VERBS: dict[str, Callable[[datetime, dict[str, Any]], Output]] = {
    "schedule create": schedule_create,
    "schedule list": schedule_list,
    "schedule show": schedule_show,
    "schedule pause": schedule_pause,
    "schedule resume": schedule_resume,
    "schedule trigger": schedule_trigger,
    **schedule_changes.VERBS,
    **declared.VERBS,
    **celery_import.VERBS,
    "run enqueue": run_enqueue,
    "run list": run_list,
    "run show": run_show,
    "run cancel": run_cancel,
    "run requeue": run_requeue,
    "worker list": worker_list,
    **queue_verbs.VERBS,
    **limit_verbs.VERBS,
    **bulk_verbs.VERBS,
    **workflow_verbs.VERBS,
    "stats": show_stats,
    "prune": prune,
    **leader_verbs.VERBS,
    "migrate-status": migrate_status,
}
