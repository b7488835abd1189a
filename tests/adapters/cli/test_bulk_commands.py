"""``distsched run requeue|cancel --state ... --yes`` (bulk on a filter) and ``distsched bulk list|show|process``."""

from __future__ import annotations

import json
import re
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from distsched_app.management.cli import progress
from distsched_app.management.commands.distsched import Command
from distsched_app.models import AuditEntry, BulkAction, BulkState, Run, RunState
from distsched_app.services import bulk
from tests.bulk_factories import make_runs

pytestmark = pytest.mark.django_db


class Terminal(StringIO):
    def isatty(self) -> bool:
        return True


def states(ids) -> set[str]:
    return set(Run.objects.filter(pk__in=ids).values_list("state", flat=True))


def test_dry_run_counts_and_writes_nothing(cli, clock):
    make_runs(4, now=clock.now(), queue="reports")
    make_runs(2, now=clock.now(), queue="emails")
    out = cli("run", "requeue", "--state", "dead", "--queue", "reports", "--dry-run")
    assert out == "would requeue 4 run(s) matching state=dead queue=reports\n"
    doc = json.loads(cli("run", "requeue", "--state", "dead", "--dry-run", "--json"))
    assert doc == {"action": "requeue", "filter": {"state": "dead"}, "dry_run": True, "count": 6}
    assert not BulkAction.objects.exists() and not AuditEntry.objects.exists()


def test_without_yes_it_refuses_and_says_how_many(cli, clock):
    make_runs(3, now=clock.now())
    with pytest.raises(CommandError, match=re.escape("would requeue 3 run(s) matching state=dead; add --yes")):
        cli("run", "requeue", "--state", "dead")
    assert not BulkAction.objects.exists()


def test_yes_creates_the_job_and_follows_it_to_the_end(cli, clock):
    ids = make_runs(5, now=clock.now(), queue="reports")
    other = make_runs(2, now=clock.now(), queue="emails", prefix="other")
    out = cli(
        "run", "requeue", "--state", "dead", "--queue", "reports", "--yes", "--reason", "fixed", "--batch-size", "2"
    )
    job = BulkAction.objects.get()
    assert out == (
        f"bulk action {job.pk} (requeue state=dead queue=reports): done, 5 of 5 matching run(s) requeued, 0 skipped\n"
    )
    assert states(ids) == {RunState.PENDING} and states(other) == {RunState.DEAD}
    assert (job.batches, job.reason, job.source) == (3, "fixed", "cli") and job.actor.startswith("cli:")
    entry = AuditEntry.objects.get()
    assert entry.data["filter"] == {"state": "dead", "queue": "reports"} and entry.data["matched"] == 5


def test_cancel_by_schedule_and_several_states_with_json(cli, clock, make_schedule):
    nightly = make_schedule("nightly")
    waiting = make_runs(2, now=clock.now(), state=RunState.PENDING, schedule=nightly)
    retrying = make_runs(1, now=clock.now(), state=RunState.RETRYING, schedule=nightly, prefix="r")
    elsewhere = make_runs(2, now=clock.now(), state=RunState.PENDING, prefix="x")
    doc = json.loads(
        cli("run", "cancel", "--schedule", "nightly", "--state", "pending", "--state", "retrying", "--yes", "--json")
    )
    assert (doc["state"], doc["done"], doc["filter"]) == (
        "done",
        3,
        {"state": ["pending", "retrying"], "schedule": "nightly"},
    )
    assert states(waiting + retrying) == {RunState.CANCELLED} and states(elsewhere) == {RunState.PENDING}


def test_a_bar_on_a_terminal(clock):
    make_runs(6, now=clock.now())
    out, err = StringIO(), Terminal()
    call_command(Command(), "run", "requeue", "--state", "dead", "--yes", "--batch-size", "2", stdout=out, stderr=err)
    final = err.getvalue().rstrip("\n").split("\r")[-1]
    assert final.startswith("requeued: 100%") and "6/6" in final and "0 skipped" in final
    assert "done, 6 of 6" in out.getvalue()


def test_ctrl_c_leaves_the_job_resumable_and_says_so(clock, monkeypatch):
    ids = make_runs(6, now=clock.now())
    real = progress.ProgressBar.update

    def update(self, done, total, postfix=""):
        real(self, done, total, postfix)
        if done == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(progress.ProgressBar, "update", update)
    out, err = StringIO(), Terminal()
    with pytest.raises(SystemExit) as info:
        call_command(
            Command(), "run", "requeue", "--state", "dead", "--yes", "--batch-size", "2", stdout=out, stderr=err
        )
    job = BulkAction.objects.get()
    assert info.value.code == 130 and "Traceback" not in err.getvalue()
    assert f"resumable: the workers go on with it, or run `distsched bulk process {job.pk}`" in out.getvalue()
    assert (job.state, job.done, job.lease_owner) == (BulkState.RUNNING, 2, "")  # the lease given up
    monkeypatch.setattr(progress.ProgressBar, "update", real)
    out = StringIO()
    call_command(Command(), "bulk", "process", str(job.pk), stdout=out, stderr=StringIO())
    assert "done, 6 of 6" in out.getvalue() and states(ids) == {RunState.PENDING}


def test_background_returns_at_once_and_bulk_show_and_list_follow(cli, clock):
    ids = make_runs(3, now=clock.now())
    out = cli("run", "requeue", "--state", "dead", "--yes", "--background")
    job = BulkAction.objects.get()
    assert "pending, 0 of 3" in out and "the workers process it" in out
    assert states(ids) == {RunState.DEAD}
    assert "processed 1 batch(es)" in cli("bulk", "process")
    shown = json.loads(cli("bulk", "show", str(job.pk), "--json"))
    assert (shown["state"], shown["done"], shown["matched"]) == ("done", 3, 3)
    assert f"{job.pk}" in cli("bulk", "list") and "state=dead" in cli("bulk", "list")


def test_one_run_by_id_still_works(cli, clock):
    [run] = make_runs(1, now=clock.now())
    assert "requeued: pending" in cli("run", "requeue", str(run))
    assert "cancelled" in cli("run", "cancel", str(run))
    assert not BulkAction.objects.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("run", "requeue"), "give a RUN_ID, or a filter"),
        (("run", "requeue", "1", "--state", "dead"), "either a RUN_ID or filter options"),
        (("run", "requeue", "--state", "succeeded", "--yes"), "requeue applies to dead, cancelled runs only"),
        (("run", "cancel", "--queue", "q", "--created-after", "soon", "--yes"), "created_after must be an ISO 8601"),
        (("run", "requeue", "--state", "dead", "--background"), "--background needs --yes"),
        (("bulk", "show", "424242"), "no bulk action with id 424242"),
    ],
)
def test_bad_input_is_one_line(cli, clock, args, message):
    with pytest.raises(CommandError, match=message):
        cli(*args)
    assert not BulkAction.objects.exists()


def test_a_job_another_processor_holds_is_watched_not_processed(cli, clock, monkeypatch):
    make_runs(2, now=clock.now())
    job = bulk.create_bulk_action(action="requeue", filter={"state": "dead"}, now=clock.now())
    bulk.acquire("worker-1", clock.now())
    looks = []

    def finish_meanwhile(seconds):  # the worker finishes while the command waits
        looks.append(seconds)
        bulk.process_batch(job.pk, "worker-1", clock.now())

    monkeypatch.setattr("distsched_app.management.cli.bulk.time.sleep", finish_meanwhile)
    out = cli("bulk", "process", str(job.pk))
    assert looks == [0.5] and "done, 2 of 2" in out


def test_bulk_cancel_stops_a_job(cli, clock):
    make_runs(3, now=clock.now())
    cli("run", "requeue", "--state", "dead", "--yes", "--background")
    job = BulkAction.objects.get()
    out = cli("bulk", "cancel", str(job.pk), "--reason", "oops")
    assert out.startswith(f"bulk action {job.pk} (requeue state=dead): cancelled, 0 of 3")
    with pytest.raises(CommandError, match="only a pending or running one can be stopped"):
        cli("bulk", "cancel", str(job.pk))
