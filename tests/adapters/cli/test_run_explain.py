"""``manage.py distsched run show``: the "waiting for" section and the ``explain`` document of --json."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from distsched_app.models import Run, RunState
from distsched_app.services import claiming, queues
from distsched_app.services.enqueue import Job, enqueue
from distsched_app.services.explain import explain
from tests.conftest import T0

pytestmark = pytest.mark.django_db


def section(out: str) -> list[str]:
    """The lines of the "waiting for:" section, [] when there is none."""
    if "\nwaiting for:\n" not in out:
        return []
    return out.split("\nwaiting for:\n")[1].split("\n\n")[0].splitlines()


def test_a_blocked_run_shows_what_it_waits_for_one_line_per_reason(cli, clock, settings):
    settings.DISTSCHED = {**settings.DISTSCHED, "LIMITS": {"one": {"task": "tests.echo", "concurrency": 1}}}
    a = enqueue(Job(task_name="tests.echo"), now=T0).run
    b = enqueue(Job(task_name="tests.echo"), now=T0 + timedelta(seconds=1)).run
    clock.advance(2)
    for worker in ("w1", "w2"):
        claiming.claim_runs(worker_id=worker, queues=None, lease_seconds=30, now=clock.now(), limit=1)
    assert Run.objects.get(pk=b.pk).state == RunState.BLOCKED
    queues.pause_queue("default", now=clock.now(), by="user:alice", reason="vendor outage")
    out = cli("run", "show", str(b.pk))
    assert section(out) == [
        "  - queue default is paused by user:alice since 2026-03-02T09:00:02Z (vendor outage): "
        "its waiting runs are not claimed until it is resumed",
        f"  - limit one is full: 1/1 running (run(s) {a.pk}); blocked since 2026-03-02T09:00:02Z, "
        "until one of them ends",
    ]
    assert out.index("waiting for:") < out.index("events:")
    doc = json.loads(cli("run", "show", str(b.pk), "--json"))
    assert doc["explain"] == explain(Run.objects.get(pk=b.pk), now=clock.now())
    assert [r["kind"] for r in doc["explain"]["waiting_for"]] == ["queue_paused", "concurrency"]
    assert doc["explain"]["waiting_for"][1]["holders"] == [a.pk]


def test_a_later_run_says_when_and_a_finished_run_has_no_section(cli, clock, scheduler, make_schedule):
    later = enqueue(Job(task_name="tests.noop", run_after=T0 + timedelta(hours=1)), now=T0).run
    assert section(cli("run", "show", str(later.pk))) == ["  - not due yet: scheduled for 2026-03-02T10:00:00Z"]
    doc = json.loads(cli("run", "show", str(later.pk), "--json"))
    assert doc["explain"]["next_possible_start"] == "2026-03-02T10:00:00Z"
    make_schedule("s1")
    [run] = scheduler.tick()
    scheduler.cancel_run(run.pk)
    out = cli("run", "show", str(run.pk))
    assert "waiting for:" not in out and section(out) == []
    assert json.loads(cli("run", "show", str(run.pk), "--json"))["explain"]["waiting_for"] == []
