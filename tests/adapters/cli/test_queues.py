"""``manage.py distsched queue pause|resume|list|history``: output, --json, errors, the actor."""

from __future__ import annotations

import getpass
import json

import pytest
from django.core.management import CommandError

from distsched_app.models import QueueEvent, QueuePause, RunState
from distsched_app.services import claiming, queues
from distsched_app.services.enqueue import Job, enqueue
from tests.concurrency.procs import finish, manage

pytestmark = pytest.mark.django_db

NOW = "2026-03-02T09:00:00Z"


def me() -> str:
    return f"cli:{getpass.getuser()}"


def test_pause_records_the_os_user_and_the_reason(cli):
    out = cli("queue", "pause", "reports", "--reason", "vendor outage")
    assert out.strip() == "paused queue reports: its runs are not claimed until it is resumed"
    pause = QueuePause.objects.get()
    assert (pause.queue, pause.paused_by, pause.reason) == ("reports", me(), "vendor outage")
    assert me() == queues.cli_actor()


def test_a_second_pause_says_who_holds_it_and_changes_nothing(cli, clock):
    queues.pause_queue("reports", now=clock.now(), by="user:alice", reason="vendor outage")
    out = cli("queue", "pause", "reports", "--reason", "mine")
    assert out.strip() == f"queue reports was already paused by user:alice at {NOW}: 'vendor outage': nothing changed"
    assert QueueEvent.objects.count() == 1


def test_resume_and_resume_again(cli, clock):
    queues.pause_queue("reports", now=clock.now(), by="user:alice", reason="vendor outage")
    assert cli("queue", "resume", "reports").strip() == (
        f"resumed queue reports (paused by user:alice at {NOW}: 'vendor outage')"
    )
    assert not QueuePause.objects.exists()
    assert QueueEvent.objects.order_by("-id").first().actor == me()
    assert cli("queue", "resume", "reports").strip() == "queue reports is not paused: nothing changed"


def test_pause_and_resume_json(cli, clock):
    document = json.loads(cli("queue", "pause", "reports", "--json"))
    assert document == {
        "queue": "reports",
        "paused": True,
        "changed": True,
        "pause": {"paused_at": NOW, "paused_by": me(), "reason": ""},
    }
    document = json.loads(cli("queue", "resume", "reports", "--json"))
    assert (document["paused"], document["changed"], document["pause"]["paused_by"]) == (False, True, me())


def test_list_table_and_json(cli, clock):
    for queue in ("default", "reports", "reports"):
        enqueue(Job(task_name="tests.noop", queue=queue), now=clock.now())
    claiming.claim_next_run(worker_id="w1", queues=["reports"], lease_seconds=30, now=clock.now())
    queues.pause_queue("reports", now=clock.now(), by="user:alice", reason="vendor outage")
    lines = cli("queue", "list").splitlines()
    assert lines[0].split() == [
        "QUEUE", "PENDING", "RETRYING", "BLOCKED", "LEASED", "RUNNING", "OLDEST", "WAIT", "LAG", "P50", "LAG", "P95",
        "PER", "MIN", "WORKERS", "LIMITS", "PAUSED",
    ]  # fmt: skip
    # Enqueued at NOW and due at once: the oldest waited 0 µs; nothing finished in the last hour.
    assert lines[1].split() == ["default", "1", "0", "0", "0", "0", "0", "µs", "-", "-", "0.0", "0", "-", "-"]
    assert lines[2].split() == [
        "reports", "1", "0", "0", "0", "1", "0", "µs", "-", "-", "0.0", "0", "-",
        "by", "user:alice", "at", f"{NOW}:", "'vendor", "outage'",
    ]  # fmt: skip
    document = json.loads(cli("queue", "list", "--json"))
    assert document[1] == {
        "queue": "reports",
        "paused": True,
        "runs": {"pending": 1, "retrying": 0, "blocked": 0, "leased": 0, "running": 1},
        "pause": {"paused_at": NOW, "paused_by": "user:alice", "reason": "vendor outage"},
        "oldest_waiting_at": NOW,
        "oldest_waiting_seconds": 0.0,
        "start_lag": {"count": 0, "p50_seconds": None, "p95_seconds": None, "max_seconds": None},
        "finished_last_hour": 0,
        "throughput_per_minute": 0.0,
        "workers": [],
        "limits": [],
    }
    assert document[0]["pause"] is None and document[0]["runs"][RunState.PENDING] == 1


def test_list_of_nothing(cli):
    assert cli("queue", "list").strip() == "no queues with unfinished runs, a pause, recent runs or a worker"
    assert json.loads(cli("queue", "list", "--json")) == []


def test_history_answers_who_paused_and_why_after_the_resume(cli, clock):
    queues.pause_queue("reports", now=clock.now(), by="user:alice", reason="vendor outage")
    clock.advance(seconds=60)
    queues.resume_queue("reports", now=clock.now(), by="cli:bob")
    lines = cli("queue", "history", "reports").splitlines()
    assert lines[0].split() == ["AT", "ACTION", "BY", "REASON"]
    assert lines[1].split() == ["2026-03-02T09:01:00Z", "resume", "cli:bob", "-"]
    assert lines[2].split() == [NOW, "pause", "user:alice", "vendor", "outage"]
    document = json.loads(cli("queue", "history", "reports", "--json", "--limit", "1"))
    assert [(e["action"], e["actor"]) for e in document] == [("resume", "cli:bob")]
    assert cli("queue", "history", "other").strip() == "queue other: no history"


@pytest.mark.parametrize("verb", ["pause", "resume", "history"])
def test_a_bad_name_is_one_line_and_writes_nothing(cli, verb):
    with pytest.raises(CommandError) as info:
        cli("queue", verb, "bad name")
    assert str(info.value) == "queue may contain only letters, digits, '.', '-' and '_' (1-100)"
    assert not QueuePause.objects.exists() and not QueueEvent.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_as_a_real_process_errors_are_one_line_and_exit_codes_differ():
    cases = [
        (["distsched", "queue", "pause"], 2, "manage.py distsched queue pause: error: the following arguments"),
        (["distsched", "queue", "pause", "bad name"], 1, "CommandError: queue may contain only letters"),
        (["distsched", "queue", "stop", "x"], 2, "manage.py distsched queue: error: argument verb: invalid choice"),
    ]
    procs = [manage(*argv) for argv, _, _ in cases]
    for (argv, code, line), (returncode, stdout, stderr) in zip(cases, finish(procs, timeout=120), strict=True):
        assert (returncode, stdout) == (code, ""), (argv, stderr)
        assert stderr.count("\n") == 1 and stderr.startswith(line), (argv, stderr)


def test_list_shows_the_last_hours_start_lag_and_throughput(cli, clock):
    from datetime import timedelta

    from distsched_app.models import Run

    now = clock.now()
    for lag in (2, 4):  # two runs started 2 s and 4 s late, finished within the hour
        run = enqueue(Job(task_name="tests.noop", queue="reports"), now=now - timedelta(minutes=10)).run
        started = run.scheduled_for + timedelta(seconds=lag)
        Run.objects.filter(pk=run.pk).update(
            state=RunState.SUCCEEDED, started_at=started, finished_at=started + timedelta(seconds=1)
        )
    [row] = json.loads(cli("queue", "list", "--json"))
    assert row["start_lag"] == {"count": 2, "p50_seconds": 2.0, "p95_seconds": 4.0, "max_seconds": 4.0}
    assert (row["finished_last_hour"], row["runs"]["pending"]) == (2, 0)
    line = cli("queue", "list").splitlines()[1].split()
    assert line[:6] == ["reports", "0", "0", "0", "0", "0"]
    assert line[6:12] == ["-", "2.00", "s", "4.00", "s", "0.0"]
