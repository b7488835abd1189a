"""``manage.py distsched limit list|show|set|reset``: output, --json, errors, the actor."""

from __future__ import annotations

import getpass
import json
from datetime import timedelta

import pytest
from django.core.management import CommandError

from distsched_app.models import LimitEvent, Run, RunState
from distsched_app.services import claiming, limit_overrides
from distsched_app.services.enqueue import Job, enqueue
from tests.concurrency.procs import finish, manage
from tests.conftest import T0

pytestmark = pytest.mark.django_db

LIMITS = {
    "one": {"task": "tests.echo", "concurrency": 1},
    "partner": {"task": "tests.noop", "rate": "2/s", "burst": 3, "partition_by": ["partner"], "missing": "shared"},
}


@pytest.fixture
def limits(settings):
    settings.DISTSCHED = {**settings.DISTSCHED, "LIMITS": LIMITS}


def me() -> str:
    return f"cli:{getpass.getuser()}"


def error_of(cli, *args: str) -> str:
    with pytest.raises(CommandError) as info:
        cli(*args)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.fixture
def blocked(limits, clock) -> list[Run]:
    """Three runs under "one" (concurrency 1): one running, two blocked; the clock 5 s past T0."""
    runs = [enqueue(Job(task_name="tests.echo"), now=T0 + timedelta(seconds=i)).run for i in range(3)]
    clock.advance(5)
    claiming.claim_runs(worker_id="w1", queues=None, lease_seconds=30, now=clock.now(), limit=3, start_all=True)
    return runs


def test_list_table_and_json(cli, blocked):
    lines = cli("limit", "list").splitlines()
    assert lines[0].split() == [
        "LIMIT", "APPLIES", "TO", "EFFECTIVE", "IN", "USE", "BLOCKED", "THROTTLED", "SATURATED", "OVERRIDDEN",
    ]  # fmt: skip
    assert lines[1].split() == ["one", "task", "tests.echo", "concurrency", "1", "1", "2", "0", "1", "no"]
    assert lines[2].split() == [
        "partner",
        "task",
        "tests.noop",
        "rate",
        "2/s",
        "(burst",
        "3)",
        "0",
        "0",
        "0",
        "0",
        "no",
    ]
    document = json.loads(cli("limit", "list", "--json"))
    assert [d["name"] for d in document] == ["one", "partner"]
    assert document[0]["in_use"] == 1 and document[0]["blocked"] == 2 and document[0]["override"] is None
    assert document[0]["top_partitions"] == [{"partition": "", "blocked": 2, "in_use": 1}]
    assert document[1]["declared"] == {
        "concurrency": None,
        "total": None,
        "rate": "2/s",
        "burst": 3,
        "local": None,
        "paused": False,
    }


def test_list_without_limits(cli):
    assert cli("limit", "list").strip() == "no limits declared (DISTSCHED['LIMITS'])"
    assert json.loads(cli("limit", "list", "--json")) == []


def test_set_overrides_lets_blocked_runs_through_and_is_audited(cli, blocked, clock):
    out = cli("limit", "set", "one", "--concurrency", "3", "--reason", "backlog", "--for", "30m")
    assert out.strip() == "limit one: concurrency 3 until 2026-03-02T09:30:05Z; 2 blocked run(s) let through"
    assert not Run.objects.filter(state=RunState.BLOCKED).exists()
    event = LimitEvent.objects.get()
    assert (event.limit, event.action, event.actor, event.reason, event.override) == (
        "one",
        "set",
        me(),
        "backlog",
        {"concurrency": 3},
    )
    assert event.until == clock.now() + timedelta(minutes=30)
    [status] = limit_overrides.status(clock.now(), name="one")
    assert (status.effective["concurrency"], status.override_by) == (3, me())


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("2h", 7200), ("600", 600), ("1d12h", 129600)])
def test_for_takes_durations_and_seconds(cli, limits, clock, text, seconds):
    cli("limit", "set", "one", "--pause", "--for", text)
    assert LimitEvent.objects.get().until == clock.now() + timedelta(seconds=seconds)


def test_set_json_rate_pause_and_no_expiry(cli, limits):
    document = json.loads(cli("limit", "set", "partner", "--rate", "10/m", "--burst", "1", "--pause", "--json"))
    assert document["override"] == {
        "values": {"rate": "10/m", "burst": 1, "paused": True},
        "by": me(),
        "reason": "",
        "until": None,
    }
    assert (document["effective"]["rate"], document["effective"]["paused"], document["released"]) == ("10/m", True, 0)
    out = cli("limit", "set", "partner", "--local", "2")
    assert out.strip() == "limit partner: local 2 until reset"  # replaces the earlier override


def test_show_has_the_override_and_the_history(cli, blocked, clock):
    cli("limit", "set", "one", "--concurrency", "2", "--reason", "more")
    clock.advance(10)  # the running run's lease (30 s) still holds its slot
    lines = cli("limit", "show", "one").splitlines()
    assert lines[:11] == [
        "limit:        one",
        "applies to:   task tests.echo",
        "partition_by: -",
        "fair:         no",
        "declared:     concurrency 1",
        f"override:     concurrency 2 by {me()} until reset: 'more'",
        "effective:    concurrency 2",
        "in use:       1",
        "blocked:      1",
        "throttled:    0",
        "saturated:    0 partition(s)",
    ]
    assert lines[12].split() == ["PARTITION", "BLOCKED", "IN", "USE"]
    assert lines[13].split() == ['""', "1", "1"]
    assert lines[15].split() == ["AT", "ACTION", "BY", "OVERRIDE", "UNTIL", "REASON"]
    assert lines[16].split() == ["2026-03-02T09:00:05Z", "set", me(), "concurrency", "2", "-", "more"]
    document = json.loads(cli("limit", "show", "one", "--json"))
    assert [(e["action"], e["actor"], e["override"]) for e in document["history"]] == [
        ("set", me(), {"concurrency": 2})
    ]
    assert document["override"]["values"] == {"concurrency": 2}


def test_show_without_history(cli, limits):
    assert cli("limit", "show", "partner").strip().endswith("no overrides yet")


def test_reset_and_reset_again(cli, blocked):
    cli("limit", "set", "one", "--pause")
    out = cli("limit", "reset", "one", "--reason", "done")
    assert out.strip() == "limit one is back to its declared numbers (concurrency 1)"
    assert list(LimitEvent.objects.order_by("id").values_list("action", "actor", "reason")) == [
        ("set", me(), ""),
        ("reset", me(), "done"),
    ]
    assert cli("limit", "reset", "one").strip() == "limit one has no override: nothing changed"
    assert LimitEvent.objects.count() == 2
    assert json.loads(cli("limit", "reset", "one", "--json"))["override"] is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("limit", "show", "nope"), "no limit named 'nope' is declared in DISTSCHED['LIMITS']"),
        (("limit", "set", "nope", "--concurrency", "1"), "no limit named 'nope' is declared in DISTSCHED['LIMITS']"),
        (("limit", "reset", "nope"), "no limit named 'nope' is declared in DISTSCHED['LIMITS']"),
        (("limit", "set", "one"), "give at least one of concurrency, total, rate, burst, local, paused"),
        (
            ("limit", "set", "one", "--reason", "x"),
            "give at least one of concurrency, total, rate, burst, local, paused",
        ),
        (("limit", "set", "one", "--concurrency", "-1"), "whole number 0-1000000"),
        (("limit", "set", "one", "--local", "0"), "whole number 1-1000000"),
        (
            ("limit", "set", "one", "--rate", "5/w"),
            "rate must look like '5/s', '100/m', '1000/h' or '10/30s', not '5/w'",
        ),
        (("limit", "set", "one", "--pause", "--for", "0.5s"), "for must be 1-31622400 seconds"),
        (("limit", "set", "one", "--pause", "--for", "400d"), "for must be 1-31622400 seconds"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(cli, limits, clock, args, message):
    assert message in error_of(cli, *args)
    assert not LimitEvent.objects.exists()
    assert all(s.override is None for s in limit_overrides.status(clock.now()))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("limit", "set", "one", "--concurrency", "many"), "argument --concurrency: 'many' is not a whole number"),
        (("limit", "set", "one", "--pause", "--for", "soon"), "argument --for: 'soon' is not a duration"),
        (("limit", "set", "one", "--pause", "--for", "-5"), "argument --for: '-5' must be a positive duration"),
        (("limit", "set", "one", "--pause", "--for", "nan"), "argument --for: 'nan' must be a positive duration"),
    ],
)
def test_bad_arguments_are_one_line(cli, limits, args, message):
    assert message in error_of(cli, *args)
    assert not LimitEvent.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_as_a_real_process_errors_are_one_line_and_exit_codes_differ():
    cases = [
        (["distsched", "limit", "set"], 2, "manage.py distsched limit set: error: the following arguments"),
        (["distsched", "limit", "set", "x", "--total", "lots"], 2, "manage.py distsched limit set: error: argument"),
        (["distsched", "limit", "set", "x", "--total", "2"], 1, "CommandError: no limit named 'x' is declared"),
        (["distsched", "limit", "show", "x"], 1, "CommandError: no limit named 'x' is declared"),
        (["distsched", "limit", "drop", "x"], 2, "manage.py distsched limit: error: argument verb: invalid choice"),
    ]
    procs = [manage(*argv) for argv, _, _ in cases]
    for (argv, code, line), (returncode, stdout, stderr) in zip(cases, finish(procs, timeout=120), strict=True):
        assert (returncode, stdout) == (code, ""), (argv, stderr)
        assert stderr.count("\n") == 1 and stderr.startswith(line), (argv, stderr)
    procs = [manage("distsched", "limit", "list"), manage("distsched", "limit", "list", "--json")]
    [(code, text, _), (json_code, document, _)] = finish(procs, timeout=120)
    assert (code, text.strip(), json_code, json.loads(document)) == (
        0,
        "no limits declared (DISTSCHED['LIMITS'])",
        0,
        [],
    )
