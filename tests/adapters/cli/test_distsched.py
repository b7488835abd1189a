"""``manage.py distsched``: every verb's output, its --json document and its errors (via call_command)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.management import CommandError

from distsched_app.clock import iso_utc
from distsched_app.models import Origin, Run, RunEvent, RunState, Schedule, Worker, WorkerStatus
from distsched_app.services import claiming, outcomes, workers
from distsched_app.services.queues import cli_actor
from tests.conftest import T0
from tests.factories import succeed

pytestmark = pytest.mark.django_db


@pytest.fixture
def cli_json(cli):
    def run(*args: str):
        return json.loads(cli(*args, "--json"))

    return run


def error_of(cli, *args: str) -> str:
    with pytest.raises(CommandError) as info:
        cli(*args)
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    return message


# ---------------------------------------------------------------- schedule create


def test_create_interval_schedule(cli):
    out = cli(
        "schedule",
        "create",
        "every-minute",
        "--task",
        "tests.echo",
        "--interval",
        "60",
        "--args",
        "[1, 2]",
        "--kwargs",
        '{"x": "y"}',
        "--queue",
        "emails",
        "--max-attempts",
        "5",
    )
    assert out == "created schedule every-minute: every 60s, task tests.echo, next run at 2026-03-02T09:00:00Z\n"
    s = Schedule.objects.get(name="every-minute")
    assert (s.kind, s.interval_seconds, s.args, s.kwargs, s.queue, s.max_attempts) == (
        "interval",
        60,
        [1, 2],
        {"x": "y"},
        "emails",
        5,
    )
    assert s.next_run_at == T0 and not s.paused


def test_create_cron_schedule_with_every_option(cli_json):
    doc = cli_json(
        "schedule",
        "create",
        "nightly",
        "--task",
        "tests.noop",
        "--cron",
        "0 3 * * *",
        "--timezone",
        "Europe/Paris",
        "--start-at",
        "2026-04-01T00:00:00+00:00",
        "--catch-up",
        "skip",
        "--overlap",
        "skip",
        "--paused",
    )
    assert doc["name"] == "nightly" and doc["kind"] == "cron" and doc["cron"] == "0 3 * * *"
    assert (doc["timezone"], doc["catch_up"], doc["overlap"], doc["paused"]) == ("Europe/Paris", "skip", "skip", True)
    assert doc["next_run_at"] == "2026-04-01T01:00:00Z"  # 03:00 in Paris (CEST) after start_at
    assert Schedule.objects.get(name="nightly").paused


def test_create_with_overlap_replace(cli_json, cli):
    doc = cli_json("schedule", "create", "r", "--task", "tests.noop", "--interval", "60", "--overlap", "replace")
    assert doc["overlap"] == "replace"
    assert Schedule.objects.get(name="r").overlap == "replace"
    assert "replace" in error_of(cli, "schedule", "create", "x", "--task", "tests.noop", "--overlap", "never")


def test_create_once_schedule(cli):
    out = cli("schedule", "create", "once", "--task", "tests.noop", "--run-at", "2026-03-03T10:00:00Z")
    assert "once" in out and "2026-03-03T10:00:00Z" in out
    assert Schedule.objects.get(name="once").run_at == T0 + timedelta(days=1, hours=1)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--task", "tests.nope", "--interval", "60"], "no task registered as 'tests.nope'"),
        (["--task", "tests.noop", "--run-at", "2020-01-01T00:00:00Z"], "is in the past"),
        (["--task", "tests.noop", "--run-at", "tomorrow"], "run_at is not an ISO 8601 datetime"),
        (["--task", "tests.noop", "--run-at", "2027-01-01T00:00:00"], "needs a time zone offset"),
        (["--task", "tests.noop", "--cron", "99 * * * *"], "invalid cron expression"),
        (["--task", "tests.noop", "--cron", "0 3 * * *", "--timezone", "Mars/Base"], "unknown time zone"),
        (["--task", "tests.noop", "--interval", "60", "--args", '{"a": 1}'], "args must be a JSON"),
        (["--task", "tests.noop", "--interval", "60", "--kwargs", "[1]"], "kwargs must be a JSON"),
        (["--task", "tests.noop", "--interval", "60", "--queue", "no spaces"], "queue may contain only"),
    ],
)
def test_create_typed_errors_are_one_line(cli, args, expected):
    assert expected in error_of(cli, "schedule", "create", "s", *args)
    assert not Schedule.objects.exists()


def test_create_duplicate_name(cli):
    cli("schedule", "create", "dup", "--task", "tests.noop", "--interval", "60")
    assert error_of(cli, "schedule", "create", "dup", "--task", "tests.noop", "--interval", "5") == (
        "a schedule named 'dup' already exists"
    )


def test_create_invalid_name(cli):
    assert "slug" in error_of(cli, "schedule", "create", "not a slug", "--task", "tests.noop", "--interval", "5")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--task", "tests.noop"], "one of the arguments --interval --cron --run-at is required"),
        (["--task", "tests.noop", "--interval", "60", "--cron", "* * * * *"], "not allowed with argument"),
        (["--interval", "60"], "the following arguments are required: --task"),
        (["--task", "tests.noop", "--interval", "0"], "argument --interval: '0' must be at least 1"),
        (["--task", "tests.noop", "--interval", "60", "--args", "[1,"], "argument --args: invalid JSON"),
        (["--task", "tests.noop", "--interval", "60", "--kwargs", "{x}"], "argument --kwargs: invalid JSON"),
        (["--task", "tests.noop", "--interval", "60", "--catch-up", "most"], "argument --catch-up: invalid choice"),
        (["--task", "tests.noop", "--interval", "60", "--max-attempts", "x"], "'x' is not a whole number"),
    ],
)
def test_create_bad_arguments_are_one_line(cli, args, expected):
    assert expected in error_of(cli, "schedule", "create", "s", *args)


def test_missing_group_or_verb(cli):
    assert "the following arguments are required" in error_of(cli)
    assert "the following arguments are required: verb" in error_of(cli, "schedule")
    assert "invalid choice: 'frobnicate'" in error_of(cli, "frobnicate")
    assert "invalid choice: 'explode'" in error_of(cli, "run", "explode")


# ------------------------------------------------------ schedule list/show/pause/resume/trigger


def test_schedule_list_table_json_and_filters(cli, cli_json, make_schedule, scheduler):
    assert cli("schedule", "list") == "no schedules\n"
    assert cli_json("schedule", "list") == []
    make_schedule("b-interval", interval_seconds=300, queue="q2")
    make_schedule("a-cron", cron="*/5 * * * *", timezone="America/New_York")
    scheduler.pause("a-cron")
    lines = cli("schedule", "list").splitlines()
    assert lines[0].split() == ["NAME", "TASK", "SCHEDULE", "NEXT", "RUN", "PAUSED", "QUEUE", "CATCH-UP", "OVERLAP"]
    assert lines[1].startswith("a-cron ") and "cron */5 * * * * (America/New_York)" in lines[1]
    assert " yes " in lines[1]
    assert lines[2].split() == [
        "b-interval",
        "tests.noop",
        "every",
        "300s",
        "2026-03-02T09:00:00Z",
        "no",
        "q2",
        "one",
        "allow",
    ]
    assert [s["name"] for s in cli_json("schedule", "list")] == ["a-cron", "b-interval"]
    assert [s["name"] for s in cli_json("schedule", "list", "--paused")] == ["a-cron"]
    assert [s["name"] for s in cli_json("schedule", "list", "--active")] == ["b-interval"]


def test_schedule_show(cli, cli_json, make_schedule, scheduler):
    make_schedule("s", interval_seconds=600, kwargs={"k": 1})
    out = cli("schedule", "show", "s")
    assert "next_run_at:  2026-03-02T09:00:00Z" in out
    assert "upcoming:     2026-03-02T09:00:00Z, 2026-03-02T09:10:00Z" in out
    assert 'kwargs:       {"k": 1}' in out
    assert "last_run:     -" in out
    run = scheduler.trigger("s")
    doc = cli_json("schedule", "show", "s")
    assert doc["upcoming"] == [iso_utc(T0 + timedelta(minutes=10 * k)) for k in range(5)]
    assert doc["last_run"] == {
        "id": run.pk,
        "state": "pending",
        "scheduled_for": "2026-03-02T09:00:00Z",
        "finished_at": None,
    }
    assert error_of(cli, "schedule", "show", "nope") == "no schedule named 'nope'"


def test_schedule_show_of_a_stored_cron_the_dialect_refuses(cli, cli_json, make_schedule):
    make_schedule("old", cron="0 3 * * *")
    Schedule.objects.filter(name="old").update(cron="0 R * * *")  # written before the strict dialect
    out = cli("schedule", "show", "old")
    assert "upcoming:     none (invalid cron expression '0 R * * *': hour field: 'R' is not a number" in out
    assert cli_json("schedule", "show", "old")["upcoming"] == []


def test_pause_resume_trigger(cli, cli_json, make_schedule, clock):
    make_schedule("s")
    assert cli("schedule", "pause", "s") == "paused schedule s\n"
    assert Schedule.objects.get(name="s").paused
    assert cli("schedule", "pause", "s") == "paused schedule s\n"  # idempotent
    assert cli("schedule", "resume", "s") == "resumed schedule s: next run at 2026-03-02T09:00:00Z\n"
    assert not Schedule.objects.get(name="s").paused
    clock.advance(seconds=5)
    doc = cli_json("schedule", "trigger", "s")
    run = Run.objects.get(pk=doc["id"])
    assert (run.origin, run.state, run.scheduled_for) == (Origin.MANUAL, RunState.PENDING, clock.now())
    assert doc["idempotency_key"] == f"manual:{run.pk}"
    assert cli("schedule", "trigger", "s").startswith(f"created run {run.pk + 1} of schedule s (manual")
    for verb in ("pause", "resume", "trigger"):
        assert error_of(cli, "schedule", verb, "ghost") == "no schedule named 'ghost'"


# ---------------------------------------------------------------------------- runs


@pytest.fixture
def three_runs(make_schedule, scheduler, clock):
    """Run 1 succeeded (s-a), run 2 dead (s-b, queue q2), run 3 pending (s-a, manual)."""
    make_schedule("s-a", task_name="tests.noop")
    make_schedule("s-b", task_name="tests.fail", max_attempts=1, queue="q2")
    first, second = sorted(scheduler.tick(), key=lambda r: r.pk)
    claiming.claim_next_run(worker_id="w", queues=["default"], lease_seconds=30, now=clock.now())
    clock.advance(seconds=2)
    succeed(first.pk, worker_id="w", attempt=1, now=clock.now())
    claiming.claim_next_run(worker_id="w", queues=["q2"], lease_seconds=30, now=clock.now())
    outcomes.record_failure(
        run_id=second.pk,
        worker_id="w",
        attempt=1,
        now=clock.now(),
        error="ValueError: boom",
        traceback_text="Traceback (most recent call last):\n  ...",
    )
    third = scheduler.trigger("s-a")
    return first, second, third


def test_run_list_newest_first_with_filters(cli, cli_json, three_runs, django_assert_num_queries):
    first, second, third = three_runs
    lines = cli("run", "list").splitlines()
    assert lines[0].split()[:5] == ["ID", "SCHEDULE", "TASK", "STATE", "ATTEMPTS"]
    assert [int(line.split()[0]) for line in lines[1:]] == [third.pk, second.pk, first.pk]
    assert lines[2].split()[:6] == [str(second.pk), "s-b", "tests.fail", "dead", "1/1", "q2"]
    with django_assert_num_queries(1):
        assert [r["id"] for r in cli_json("run", "list")] == [third.pk, second.pk, first.pk]
    assert [r["id"] for r in cli_json("run", "list", "--state", "dead")] == [second.pk]
    assert [r["id"] for r in cli_json("run", "list", "--schedule", "s-a")] == [third.pk, first.pk]
    assert [r["id"] for r in cli_json("run", "list", "--task", "tests.fail")] == [second.pk]
    assert [r["id"] for r in cli_json("run", "list", "--queue", "default", "--limit", "1")] == [third.pk]
    assert cli("run", "list", "--state", "running") == "no runs\n"
    assert error_of(cli, "run", "list", "--schedule", "ghost") == "no schedule named 'ghost'"
    assert "argument --state: invalid choice: 'done'" in error_of(cli, "run", "list", "--state", "done")
    assert "'0' must be at least 1" in error_of(cli, "run", "list", "--limit", "0")


def test_run_show_prints_fields_and_events_in_order(cli, cli_json, three_runs):
    _, dead, _ = three_runs
    out = cli("run", "show", str(dead.pk))
    assert f"id:               {dead.pk}" in out
    assert "state:            dead" in out and "attempts:         1/1" in out
    assert "last error:\nValueError: boom\n\nTraceback (most recent call last):" in out
    kinds = [line.split()[1] for line in out.split("events:\n")[1].split("\n\n")[0].splitlines()[1:]]
    assert kinds == ["created", "claimed", "started", "failed", "marked_dead"]
    doc = cli_json("run", "show", str(dead.pk))
    assert [e["event_type"] for e in doc["events"]] == kinds
    assert doc["state"] == "dead" and doc["schedule"] == "s-b" and doc["last_error"].startswith("ValueError: boom")
    assert [e["id"] for e in doc["events"]] == sorted(e["id"] for e in doc["events"])


def test_run_show_errors(cli):
    assert error_of(cli, "run", "show", "999") == "no run with id 999"
    assert "'abc' is not a run id" in error_of(cli, "run", "show", "abc")
    assert "is not a valid run id" in error_of(cli, "run", "show", str(2**64))
    assert "is not a valid run id" in error_of(cli, "run", "show", "0")


def test_run_cancel(cli, cli_json, three_runs, clock):
    succeeded, _, pending = three_runs
    assert cli("run", "cancel", str(pending.pk)) == f"run {pending.pk} cancelled\n"
    assert Run.objects.get(pk=pending.pk).state == RunState.CANCELLED
    assert RunEvent.objects.filter(run=pending, event_type="cancelled").get().message == f"cancelled by {cli_actor()}"
    assert error_of(cli, "run", "cancel", str(succeeded.pk)) == (
        f"run {succeeded.pk} is succeeded; only pending, retrying, blocked, leased or running runs can be cancelled"
    )
    assert error_of(cli, "run", "cancel", "12345") == "no run with id 12345"


def test_run_cancel_running_requests_cooperative_stop(cli_json, make_schedule, scheduler, clock):
    make_schedule("s")
    scheduler.tick()
    run = claiming.claim_next_run(worker_id="w", queues=None, lease_seconds=30, now=clock.now())
    doc = cli_json("run", "cancel", str(run.pk))
    assert (doc["state"], doc["cancel_requested"]) == ("running", True)


def test_run_requeue(cli, three_runs):
    succeeded, dead, _ = three_runs
    assert cli("run", "requeue", str(dead.pk)) == f"run {dead.pk} requeued: pending, up to 1 more attempt(s)\n"
    dead.refresh_from_db()
    assert (dead.state, dead.attempts, dead.max_attempts) == (RunState.PENDING, 1, 2)
    assert error_of(cli, "run", "requeue", str(succeeded.pk)) == (
        f"run {succeeded.pk} is succeeded; only dead or cancelled runs can be requeued"
    )


def test_run_requeue_refuses_a_unique_key_another_run_holds(cli, clock):
    cli("run", "enqueue", "tests.noop", "--unique-key", "nightly")
    first = Run.objects.get()
    cli("run", "cancel", str(first.pk))
    cli("run", "enqueue", "tests.noop", "--unique-key", "nightly")
    holder = Run.objects.exclude(pk=first.pk).get()
    assert error_of(cli, "run", "requeue", str(first.pk)) == (
        f"run {first.pk} cannot be requeued: unfinished run {holder.pk} of task tests.noop "
        "holds its unique key 'nightly'"
    )
    assert Run.objects.get(pk=first.pk).state == RunState.CANCELLED


# ------------------------------------------------------------- workers, stats, prune


def test_worker_list(cli, cli_json, clock, settings, make_schedule, scheduler):
    settings.DISTSCHED = {"STALE_AFTER_SECONDS": 30}
    assert cli("worker", "list") == "no workers\n"
    make_schedule("s")
    scheduler.tick()
    run = claiming.claim_next_run(worker_id="busy", queues=None, lease_seconds=30, now=clock.now())
    for wid in ("busy", "silent", "done"):
        workers.register_worker(worker_id=wid, hostname="host1", pid=7, queues=["default", "q2"], now=clock.now())
    workers.set_status(worker_id="done", status=WorkerStatus.STOPPED, now=clock.now())
    clock.advance(seconds=40)
    workers.heartbeat(
        worker_id="busy", now=clock.now() - timedelta(seconds=2), current_run_id=run.pk, clock_skew_seconds=0.25
    )
    doc = {w["worker_id"]: w for w in cli_json("worker", "list")}
    assert {
        k: doc["busy"][k]
        for k in ("liveness", "stale", "heartbeat_age_seconds", "current_run", "clock_skew_seconds", "status")
    } == {
        "liveness": "alive",
        "stale": False,
        "heartbeat_age_seconds": 2.0,
        "current_run": run.pk,
        "clock_skew_seconds": 0.25,
        "status": "active",
    }
    assert (doc["silent"]["liveness"], doc["silent"]["stale"], doc["silent"]["heartbeat_age_seconds"]) == (
        "stale",
        True,
        40.0,
    )
    assert (doc["done"]["liveness"], doc["done"]["stale"]) == ("stopped", False)
    lines = cli("worker", "list").splitlines()
    assert lines[0].split()[:7] == ["WORKER", "HOST", "PID", "QUEUES", "CAPABILITIES", "STATUS", "LIVENESS"]
    assert lines[1].split() == [
        "busy",
        "host1",
        "7",
        "default,q2",
        "-",
        "active",
        "alive",
        "2.0s",
        str(run.pk),
        "0",
        "250ms",
    ]
    assert lines[3].split()[:7] == ["silent", "host1", "7", "default,q2", "-", "active", "stale"]


def test_stats(cli, cli_json, three_runs):
    doc = cli_json("stats")
    assert doc["runs_by_state"]["succeeded"] == 1 and doc["runs_by_state"]["dead"] == 1
    assert doc["runs_by_state"]["pending"] == 1
    assert (doc["schedules_total"], doc["failures_last_24h"]) == (2, 1)
    assert doc["recent_failures"][0]["message"] == "ValueError: boom"
    out = cli("stats")
    assert "runs:" in out and "succeeded 1" in out and "dead 1" in out
    assert "schedules:           2 total, 0 paused, 0 overdue" in out
    assert "recent failures:" in out and "ValueError: boom" in out


def test_prune(cli, cli_json, three_runs, clock):
    _first, _second, third = three_runs
    clock.advance(days=31)
    doc = cli_json("prune", "--older-than", "30d", "--dry-run")
    assert {k: doc[k] for k in ("runs", "events", "dry_run")} == {"runs": 2, "events": 9, "dry_run": True}
    assert Run.objects.count() == 3
    out = cli("prune", "--older-than", "30d", "--batch-size", "1")
    assert out == (
        "deleted 2 run(s) finished before 2026-03-03T09:00:02Z, 9 event(s) and 0 worker(s) silent since then\n"
    )
    assert list(Run.objects.values_list("pk", flat=True)) == [third.pk]
    assert cli_json("prune", "--older-than", "1h")["runs"] == 0


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("30", "is not a duration"),
        ("30x", "is not a duration"),
        ("", "is not a duration"),
        ("-1d", "is not a duration"),
        ("0s", "must be a positive duration"),
        ("1d 2h", "is not a duration"),
    ],
)
def test_prune_bad_durations(cli, value, expected):
    assert expected in error_of(cli, "prune", f"--older-than={value}")


@pytest.mark.parametrize(
    ("value", "expected"),
    [("x", "is not a number"), ("-1", "between 0 and 10"), ("11", "between 0 and 10"), ("nan", "between 0 and 10")],
)
def test_prune_bad_pause(cli, value, expected):
    assert expected in error_of(cli, "prune", "--older-than=1d", f"--pause={value}")


def test_prune_pause_zero_is_accepted(cli, three_runs, clock):
    clock.advance(days=31)
    assert "deleted 2 run(s)" in cli("prune", "--older-than", "30d", "--pause", "0")


def test_prune_requires_older_than(cli):
    assert "the following arguments are required: --older-than" in error_of(cli, "prune")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30d", 30 * 86400),
        ("12h", 43200),
        ("90m", 5400),
        ("45s", 45),
        ("1d12h", 129600),
        ("1.5h", 5400),
        ("2D", 172800),
    ],
)
def test_duration_units(text, seconds):
    from distsched_app.management.cli.args import duration

    assert duration(text) == timedelta(seconds=seconds)


def test_json_output_is_only_json(cli, make_schedule, three_runs):
    run_id = str(three_runs[0].pk)
    for args in (
        ("schedule", "list"),
        ("schedule", "show", "s-a"),
        ("run", "list"),
        ("run", "show", run_id),
        ("worker", "list"),
        ("stats",),
        ("prune", "--older-than", "1d", "--dry-run"),
    ):
        json.loads(cli(*args, "--json"))  # the whole of stdout parses


def test_worker_rows_are_untouched_by_reads(cli, clock):
    workers.register_worker(worker_id="w", hostname="h", pid=1, queues=[], now=clock.now())
    before = Worker.objects.values().get()
    cli("worker", "list")
    cli("stats")
    assert Worker.objects.values().get() == before
