"""``manage.py distsched`` as a real process: one line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import json

import pytest

from distsched_app.clock import SystemClock
from distsched_app.services import schedules
from tests.concurrency.procs import finish, manage

pytestmark = pytest.mark.django_db(transaction=True)

DEEP = "[" * 5000 + "]" * 5000  # json.loads raises RecursionError

# (argv, expected exit code, expected start of the one stderr line)
FAILURES = [
    (["distsched"], 2, "manage.py distsched: error: the following arguments are required"),
    (
        ["distsched", "schedule", "create"],
        2,
        "manage.py distsched schedule create: error: the following arguments are required: NAME, --task",
    ),
    (
        ["distsched", "schedule", "create", "x", "--task", "tests.noop"],
        2,
        "manage.py distsched schedule create: error: one of the arguments --interval --cron --run-at is required",
    ),
    (
        ["distsched", "schedule", "create", "x", "--task", "tests.noop", "--interval", "60", "--args", "[1,"],
        2,
        "manage.py distsched schedule create: error: argument --args: invalid JSON",
    ),
    (["distsched", "prune", "--older-than", "soon"], 2, "manage.py distsched prune: error: argument --older-than"),
    (["distsched", "run", "show", "999"], 1, "CommandError: no run with id 999"),
    (
        ["distsched", "schedule", "create", "taken", "--task", "tests.noop", "--interval", "60"],
        1,
        "CommandError: a schedule named 'taken' already exists",
    ),
    (
        ["distsched", "schedule", "create", "x", "--task", "tests.missing", "--interval", "60"],
        1,
        "CommandError: no task registered as 'tests.missing'",
    ),
    (["distsched", "run", "requeue", "RUN"], 1, "CommandError: run RUN is pending; only dead or cancelled"),
    (
        ["distsched", "run", "enqueue", "tests.noop", "--priority", "x"],
        2,
        "manage.py distsched run enqueue: error: argument --priority: 'x' is not a whole number",
    ),
    (["distsched", "run", "enqueue", "tests.missing"], 1, "CommandError: no task registered as 'tests.missing'"),
    (
        ["distsched", "run", "enqueue", "tests.noop", "--priority", "500"],
        1,
        "CommandError: priority must be between -100 and 100",
    ),
    (
        ["distsched", "schedule", "create", "x", "--task", "tests.noop", "--interval", "60", "--args", DEEP],
        2,
        "manage.py distsched schedule create: error: argument --args: args is nested deeper than",
    ),
    (
        ["distsched", "run", "enqueue", "tests.noop", "--kwargs", f'{{"k": {DEEP}}}'],
        2,
        "manage.py distsched run enqueue: error: argument --kwargs: kwargs is nested deeper than",
    ),
]


def test_errors_are_one_line_on_stderr_with_a_non_zero_exit():
    now = SystemClock().now()
    schedules.create_schedule(name="taken", task_name="tests.noop", interval_seconds=60, now=now)
    run = schedules.trigger_schedule("taken", now=now)
    cases = [
        ([str(run.pk) if a == "RUN" else a for a in argv], code, line.replace("RUN", str(run.pk)))
        for argv, code, line in FAILURES
    ]
    procs = [manage(*argv) for argv, _, _ in cases]  # in parallel: each pays Django's start-up once
    for (argv, code, line), (returncode, stdout, stderr) in zip(cases, finish(procs, timeout=120), strict=True):
        assert returncode == code, (argv, stderr)
        assert stdout == "", argv
        assert stderr.count("\n") == 1 and stderr.endswith("\n"), (argv, stderr)
        assert stderr.startswith(line), (argv, stderr)
        assert "Traceback" not in stderr


def test_json_on_stdout_and_nothing_else():
    create = manage(
        "distsched",
        "schedule",
        "create",
        "nightly",
        "--task",
        "tests.echo",
        "--cron",
        "0 3 * * *",
        "--timezone",
        "Europe/Paris",
        "--kwargs",
        '{"account_id": 42}',
        "--json",
    )
    ((code, stdout, stderr),) = finish([create], timeout=60)
    assert code == 0, stderr
    assert json.loads(stdout)["kwargs"] == {"account_id": 42}
    listing = manage("distsched", "schedule", "list", "--json")
    stats = manage("distsched", "stats", "--json")
    for code, stdout, stderr in finish([listing, stats], timeout=60):
        assert code == 0, stderr
        assert stderr == ""
        json.loads(stdout)
    assert schedules.get_schedule("nightly").timezone == "Europe/Paris"
