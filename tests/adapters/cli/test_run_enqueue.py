"""``manage.py distsched run enqueue``, and enqueued runs in ``run list`` / ``run show`` (via call_command)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command

from distsched_app.models import EventType, Origin, Run, RunEvent, RunState
from tests.conftest import T0

pytestmark = pytest.mark.django_db


def error_of(cli, *args: str) -> str:
    with pytest.raises(CommandError) as info:
        cli(*args)
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def nothing_written() -> bool:
    return not Run.objects.exists() and not RunEvent.objects.exists()


def test_enqueue_prints_the_run_and_writes_one_run_and_its_event(cli):
    out = cli("run", "enqueue", "tests.echo", "--args", "[1, 2]", "--kwargs", '{"x": "y"}', "--priority", "-5")
    run = Run.objects.get()
    assert out == f"created run {run.pk} of task tests.echo (enqueued, queue default, priority -5)\n"
    assert (run.schedule_id, run.origin, run.state, run.args, run.kwargs) == (
        None,
        Origin.ENQUEUED,
        RunState.PENDING,
        [1, 2],
        {"x": "y"},
    )
    assert (run.priority, run.queue, run.unique_key, run.available_at) == (-5, "default", "", T0)
    assert run.retry_policy == {"attempts": 3, "base": 10.0, "cap": 3600.0, "jitter": 0.0}  # DISTSCHED's defaults
    [event] = RunEvent.objects.all()
    assert (event.run_id, event.event_type, event.message) == (
        run.pk,
        EventType.CREATED,
        "enqueued from the command line",
    )


def test_enqueue_json_is_the_run_and_whether_it_was_created(cli):
    run_after = "2026-03-02T12:00:00+02:00"  # 10:00 UTC
    doc = json.loads(
        cli(
            "run", "enqueue", "tests.noop", "--run-after", run_after, "--queue", "emails", "--unique-key", "k", "--json"
        )
    )
    run = Run.objects.get()
    assert doc["id"] == run.pk and doc["created"] is True
    assert (doc["schedule"], doc["origin"], doc["queue"], doc["priority"], doc["unique_key"]) == (
        None,
        "enqueued",
        "emails",
        0,
        "k",
    )
    assert doc["scheduled_for"] == doc["available_at"] == "2026-03-02T10:00:00Z"
    assert doc["retry_policy"] == {
        "max_attempts": 3,
        "retry_base_seconds": 10.0,
        "retry_max_seconds": 3600.0,
        "retry_jitter": 0.0,
    }


def test_a_later_run_says_when(cli):
    out = cli("run", "enqueue", "tests.noop", "--run-after", "2026-03-02T09:30:00Z")
    assert out.endswith("(enqueued, queue default, priority 0), not before 2026-03-02T09:30:00Z\n")


def test_a_taken_unique_key_shows_the_active_run_and_writes_nothing(cli):
    cli("run", "enqueue", "tests.noop", "--unique-key", "nightly")
    run = Run.objects.get()
    out = cli("run", "enqueue", "tests.noop", "--unique-key", "nightly", "--priority", "9")
    assert out == f"run {run.pk} holds unique key 'nightly' and is pending: nothing enqueued\n"
    doc = json.loads(cli("run", "enqueue", "tests.noop", "--unique-key", "nightly", "--json"))
    assert (doc["id"], doc["created"], doc["task_name"], doc["priority"]) == (run.pk, False, "tests.noop", 0)
    assert Run.objects.count() == 1 and RunEvent.objects.count() == 1
    # The key is held per task: another task's run with it is enqueued.
    out = cli("run", "enqueue", "tests.echo", "--unique-key", "nightly")
    assert out.startswith("created run ") and Run.objects.filter(unique_key="nightly").count() == 2


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["nope"], "no task registered as 'nope'"),
        (["tests.noop", "--priority", "101"], "priority must be between -100 and 100"),
        (["tests.noop", "--priority", "-101"], "priority must be between -100 and 100"),
        (["tests.noop", "--run-after", "2026-03-02T10:00:00"], "run_after needs a time zone offset"),
        (["tests.noop", "--run-after", "soon"], "run_after is not an ISO 8601 datetime"),
        (["tests.noop", "--queue", "no spaces"], "queue may contain only"),
        (["tests.noop", "--args", '{"a": 1}'], "args must be a JSON list"),
        (["tests.noop", "--kwargs", "[1]"], "kwargs must be a JSON object"),
        (["tests.noop", "--unique-key", "k" * 256], "unique_key must be a string of at most 255 characters"),
        (["tests.noop", "--unique-key", "bad\udcff"], "unique_key contains"),
        (["tests.noop", "--unique-key", "  "], "unique_key must not be blank"),
    ],
)
def test_typed_errors_are_one_line_and_write_nothing(cli, args, expected):
    assert expected in error_of(cli, "run", "enqueue", *args)
    assert nothing_written()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], "the following arguments are required: TASK"),
        (["tests.noop", "--priority", "high"], "argument --priority: 'high' is not a whole number"),
        (["tests.noop", "--args", "[1,"], "argument --args: invalid JSON"),
        (["tests.noop", "--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_arguments_are_one_line_and_write_nothing(cli, args, expected):
    assert expected in error_of(cli, "run", "enqueue", *args)
    assert nothing_written()


def test_the_enqueued_run_is_executed_by_a_worker_pass(cli):
    cli("run", "enqueue", "tests.echo", "--args", "[7]")
    run = Run.objects.get()
    call_command("runworker", "--once", "--worker-id", "cli-1")
    run.refresh_from_db()
    assert (run.state, run.result, run.attempts) == (RunState.SUCCEEDED, {"args": [7], "kwargs": {}}, 1)
    history = list(RunEvent.objects.filter(run=run).order_by("id").values_list("event_type", "worker_id"))
    assert history == [("created", ""), ("claimed", "cli-1"), ("started", "cli-1"), ("succeeded", "cli-1")]


def test_a_framework_task_by_its_module_path_runs_with_its_context(cli, scheduler):
    cli("run", "enqueue", "tests.testapp.tasks.ft_context", "--kwargs", '{"note": "from the CLI"}')
    assert scheduler.worker(worker_id="w1", heartbeat_seconds=3600).run_once().state == RunState.SUCCEEDED
    run = Run.objects.get()
    assert run.result["note"] == "from the CLI" and run.result["idempotency_key"] == f"enqueued:{run.pk}"


# ---------------------------------------------------------------- run list / run show


@pytest.fixture
def mixed(cli, make_schedule, scheduler, clock):
    """A ticked run of s1, a manual run of s1, and two enqueued runs (priority 5 on q2, and -1)."""
    make_schedule("s1")
    [ticked] = scheduler.tick()
    manual = scheduler.trigger("s1")
    clock.advance(seconds=1)
    high = json.loads(cli("run", "enqueue", "tests.noop", "--priority", "5", "--queue", "q2", "--json"))["id"]
    low = json.loads(cli("run", "enqueue", "tests.echo", "--priority", "-1", "--json"))["id"]
    return {"ticked": ticked.pk, "manual": manual.pk, "high": high, "low": low}


def test_run_list_shows_priority_and_no_schedule_for_enqueued_runs(cli, mixed):
    lines = cli("run", "list").splitlines()
    assert lines[0].split() == [
        "ID",
        "SCHEDULE",
        "TASK",
        "STATE",
        "ATTEMPTS",
        "QUEUE",
        "PRIORITY",
        "SCHEDULED",
        "FOR",
        "STARTED",
        "FINISHED",
    ]
    rows = {int(line.split()[0]): line.split() for line in lines[1:]}
    assert rows[mixed["high"]][:7] == [str(mixed["high"]), "-", "tests.noop", "pending", "0/3", "q2", "5"]
    assert rows[mixed["low"]][:7] == [str(mixed["low"]), "-", "tests.echo", "pending", "0/3", "default", "-1"]
    assert rows[mixed["ticked"]][:7] == [str(mixed["ticked"]), "s1", "tests.noop", "pending", "0/3", "default", "0"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--origin", "enqueued"], ["low", "high"]),
        (["--origin", "manual"], ["manual"]),
        (["--origin", "schedule"], ["ticked"]),
        (["--origin", "enqueued", "--queue", "q2"], ["high"]),
        (["--origin", "enqueued", "--schedule", "s1"], []),
        (["--schedule", "s1"], ["manual", "ticked"]),
    ],
)
def test_run_list_by_origin(cli, mixed, args, expected):
    doc = json.loads(cli("run", "list", *args, "--json"))
    assert [r["id"] for r in doc] == [mixed[k] for k in expected]
    assert all(r["schedule"] is None for r in doc if r["origin"] == "enqueued")


def test_run_list_with_enqueued_runs_is_one_query(cli, mixed, django_assert_num_queries):
    with django_assert_num_queries(1):
        cli("run", "list", "--json")


def test_run_list_origin_must_be_known(cli):
    assert "argument --origin: invalid choice: 'cron'" in error_of(cli, "run", "list", "--origin", "cron")


def test_run_show_of_an_enqueued_run(cli, clock):
    cli("run", "enqueue", "tests.echo", "--priority", "3", "--unique-key", "weekly")
    run = Run.objects.get()
    out = cli("run", "show", str(run.pk))
    assert "schedule:         -\n" in out and "priority:         3\n" in out and "origin:           enqueued\n" in out
    assert "unique_key:       weekly\n" in out
    assert "retry_policy:     3 attempt(s), base 10s, max 3600s, jitter 0\n" in out
    assert "enqueued from the command line" in out.split("events:\n")[1]
    doc = json.loads(cli("run", "show", str(run.pk), "--json"))
    assert (doc["schedule"], doc["priority"], doc["unique_key"]) == (None, 3, "weekly")
    assert [e["event_type"] for e in doc["events"]] == ["created"]


def test_run_show_of_a_scheduled_run_names_its_schedules_policy(cli, make_schedule, scheduler):
    make_schedule("s1")
    [run] = scheduler.tick()
    out = cli("run", "show", str(run.pk))
    assert "schedule:         s1\n" in out and "priority:         0\n" in out
    assert "retry_policy:     the schedule's\n" in out and "unique_key:       -\n" in out
    assert json.loads(cli("run", "show", str(run.pk), "--json"))["retry_policy"] is None


def test_the_clock_is_read_once(cli, clock):
    clock.advance(minutes=3)
    doc = json.loads(cli("run", "enqueue", "tests.noop", "--json"))
    assert doc["created_at"] == doc["scheduled_for"] == "2026-03-02T09:03:00Z"
    assert Run.objects.get().created_at == T0 + timedelta(minutes=3)


def test_a_framework_task_without_queue_goes_to_its_declared_queue(cli):
    cli("run", "enqueue", "tests.testapp.tasks.ft_mail")
    run = Run.objects.get()
    assert (run.queue, run.priority, run.max_attempts) == ("mail", -3, 3)  # its @task and its backend's OPTIONS
