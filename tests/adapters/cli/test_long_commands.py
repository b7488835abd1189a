"""Feedback on long commands: ``distsched prune``'s bar on a terminal, its one summary line
elsewhere, a clean Ctrl-C (exit 130, what was done, no traceback), and ``tick --loop``'s
start, periodic summary and stop lines."""

from __future__ import annotations

import json
import logging
import os
import signal
from datetime import timedelta
from io import StringIO
from unittest.mock import ANY

import pytest
from django.core.management import call_command

from distsched_app.db import server
from distsched_app.management.cli import progress
from distsched_app.management.commands.distsched import Command
from distsched_app.models import EventType, Origin, Run, RunEvent, RunState
from distsched_app.services import events
from tests.conftest import T0

pytestmark = pytest.mark.django_db

DAY = timedelta(days=1)


class Terminal(StringIO):
    """What a command's stderr is when a person watches it."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def old_runs(make_schedule):
    """Five runs that finished 40 days ago, two events each, and one that finished yesterday."""
    schedule = make_schedule("s1")
    made = []
    for i, age in enumerate([40] * 5 + [1]):
        run = Run.objects.create(
            schedule=schedule,
            task_name="tests.noop",
            state=RunState.SUCCEEDED,
            scheduled_for=T0 - 60 * DAY,
            available_at=T0 - 60 * DAY,
            finished_at=T0 - age * DAY,
            origin=Origin.MANUAL,
            idempotency_key=f"k{i}",
            created_at=T0 - 60 * DAY,
            updated_at=T0 - 60 * DAY,
        )
        events.record_many([events.NewEvent(run_id=run.pk, event_type=EventType.CREATED, now=T0) for _ in range(2)])
        made.append(run)
    return made


def prune(*args: str, stderr: StringIO | None = None) -> tuple[str, str]:
    out, err = StringIO(), stderr if stderr is not None else StringIO()
    call_command(Command(), "prune", "--older-than", "30d", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


SUMMARY = "deleted 5 run(s) finished before 2026-01-31T09:00:00Z, 10 event(s) and 0 worker(s) silent since then\n"


@pytest.mark.usefixtures("clock")
def test_on_a_terminal_a_bar_with_rate_and_eta_then_the_summary_line(old_runs):
    out, err = prune("--batch-size", "2", stderr=Terminal())
    assert out == SUMMARY
    final = err.rstrip("\n").split("\r")[-1]
    assert final.startswith("pruning: 100%") and "5/5" in final
    assert "run/s" in final and "<" in final  # rate, and elapsed<remaining (the ETA)
    assert "10 events" in final
    assert Run.objects.count() == 1


@pytest.mark.usefixtures("clock")
def test_elsewhere_only_the_summary_line(old_runs):
    out, err = prune("--batch-size", "2")
    assert (out, err) == (SUMMARY, "")


@pytest.mark.usefixtures("clock")
def test_json_draws_no_bar_even_on_a_terminal(old_runs):
    out, err = prune("--json", stderr=Terminal())
    assert err == ""
    doc = json.loads(out)
    assert (doc["runs"], doc["events"], doc["interrupted"]) == (5, 10, False)


@pytest.mark.usefixtures("clock")
def test_nothing_to_prune_draws_nothing(old_runs):
    out, err = prune("--dry-run", stderr=Terminal())
    assert err == "" and out.startswith("would delete 5 run(s)")
    Run.objects.all().delete()
    out, err = prune(stderr=Terminal())
    assert err == "" and out.startswith("deleted 0 run(s)")


@pytest.fixture
def interrupt_at_second_batch(monkeypatch):
    """Ctrl-C, as the progress callback sees it, once two batches are committed."""
    real = progress.ProgressBar.update

    def update(self, done, total, postfix=""):
        real(self, done, total, postfix)
        if done == 4:
            raise KeyboardInterrupt

    monkeypatch.setattr(progress.ProgressBar, "update", update)


@pytest.mark.usefixtures("clock", "interrupt_at_second_batch")
def test_ctrl_c_stops_between_batches_says_what_was_done_and_exits_130(old_runs):
    out, err = StringIO(), Terminal()
    with pytest.raises(SystemExit) as info:
        call_command(Command(), "prune", "--older-than", "30d", "--batch-size", "2", stdout=out, stderr=err)
    assert info.value.code == 130
    assert out.getvalue() == (
        "interrupted: deleted 4 run(s) finished before 2026-01-31T09:00:00Z and 8 event(s) in 2 batch(es); "
        "the batch in progress was rolled back and no worker was deleted; run it again to go on\n"
    )
    assert "Traceback" not in err.getvalue() and "KeyboardInterrupt" not in err.getvalue()
    assert err.getvalue().endswith("\n")  # the bar was closed before the summary
    # Consistent: the two runs left (one old, one young) have their whole history; no orphan event.
    assert sorted(Run.objects.values_list("pk", flat=True)) == [old_runs[4].pk, old_runs[5].pk]
    assert RunEvent.objects.count() == 4
    assert not RunEvent.objects.exclude(run_id__in=Run.objects.values("pk")).exists()


@pytest.mark.usefixtures("clock")
def test_ctrl_c_with_json_prints_the_document_of_what_was_done(old_runs, monkeypatch):
    from distsched_app.services import maintenance

    real = maintenance.delete_batch
    batches = []

    def interrupted_on_third(*args, **kwargs):
        batches.append(args)
        if len(batches) == 3:
            raise KeyboardInterrupt  # as the third batch starts
        return real(*args, **kwargs)

    monkeypatch.setattr(maintenance, "delete_batch", interrupted_on_third)
    out, err = StringIO(), StringIO()
    with pytest.raises(SystemExit) as info:
        call_command(Command(), "prune", "--older-than", "30d", "--batch-size", "2", "--json", stdout=out, stderr=err)
    assert info.value.code == 130 and err.getvalue() == ""
    doc = json.loads(out.getvalue())
    assert {k: doc[k] for k in ("runs", "events", "batches", "workers", "interrupted")} == {
        "runs": 4,
        "events": 8,
        "batches": 2,
        "workers": 0,
        "interrupted": True,
    }
    assert Run.objects.count() == 2


# ------------------------------------------------------------------ tick --loop


@pytest.fixture
def restore_signal_handlers():
    """``tick --loop`` installs SIGTERM/SIGINT handlers in this (the test's) process."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.mark.usefixtures("restore_signal_handlers")
def test_tick_loop_logs_start_a_summary_a_minute_and_stop(monkeypatch, caplog, clock):
    from distsched_app.services import leader_chores  # the loop ticks through its leadership

    calls = []

    def tick(*, now, fence=None):
        calls.append(now)
        clock.advance(seconds=25)  # each tick "takes" 25 s of the fake clock: summaries at 75 s and 150 s
        if len(calls) == 7:
            os.kill(os.getpid(), signal.SIGTERM)  # the loop's own stop signal
        return ["a run"] if len(calls) in (2, 6) else []

    monkeypatch.setattr(leader_chores, "tick", tick)
    with caplog.at_level(logging.INFO, logger="distsched"):
        call_command("tick", "--loop", "--interval", "0.001")
    lines = [(r.getMessage(), r.distsched) for r in caplog.records if r.getMessage().startswith("ticker")]
    assert [message for message, _ in lines] == ["ticker started", "ticker summary", "ticker summary", "ticker stopped"]
    started, first, second, stopped = (fields for _, fields in lines)
    assert started == {"database": server.describe(), "interval": 0.001, "pid": os.getpid(), "holder": ANY}
    assert started["database"].startswith(("sqlite:///", "postgresql://"))
    assert first == {"ticks": 3, "runs_created": 1, "failed_ticks": 0, "seconds": 75.0}
    assert second == {"ticks": 3, "runs_created": 1, "failed_ticks": 0, "seconds": 75.0}
    assert stopped == {"ticks": 7, "runs_created": 2, "failed_ticks": 0, "seconds": 175.0, "pid": os.getpid()}


@pytest.mark.usefixtures("restore_signal_handlers")
def test_tick_loop_counts_failed_ticks_in_its_stop_line(monkeypatch, caplog, clock):
    from distsched_app.services import leader_chores  # the loop ticks through its leadership

    calls = []

    def tick(*, now, fence=None):
        calls.append(now)
        if len(calls) == 1:
            raise RuntimeError("a bug in one tick")
        os.kill(os.getpid(), signal.SIGTERM)
        return []

    monkeypatch.setattr(leader_chores, "tick", tick)  # its backoff is 2x the interval: 2 ms
    with caplog.at_level(logging.INFO, logger="distsched"):
        call_command("tick", "--loop", "--interval", "0.001")
    [stopped] = [r.distsched for r in caplog.records if r.getMessage() == "ticker stopped"]
    assert (stopped["ticks"], stopped["failed_ticks"]) == (2, 1)


def test_database_label_names_vendor_server_and_database_never_credentials(monkeypatch):
    from django.db import connection

    monkeypatch.setitem(connection.settings_dict, "USER", "db-user-x7q")
    monkeypatch.setitem(connection.settings_dict, "PASSWORD", "s3cret-pw")
    label = server.describe()
    assert "s3cret-pw" not in label and "db-user-x7q" not in label
    assert label.startswith(f"{connection.vendor}://") and str(connection.settings_dict["NAME"]) in label


def test_out_of_a_terminal_and_on_a_closed_stream_no_bar():
    closed = StringIO()
    closed.close()  # its isatty() raises ValueError
    assert progress.on_terminal(Terminal()) and not progress.on_terminal(StringIO())
    assert not progress.on_terminal(closed) and not progress.on_terminal(object())


def test_the_bar_follows_more_work_than_counted_and_draws_nothing_for_none():
    from django.core.management.base import OutputWrapper

    err = Terminal()
    bar = progress.ProgressBar(OutputWrapper(err), desc="pruning", unit="run")
    bar.update(0, 0)
    assert err.getvalue() == ""  # nothing to do: no bar
    bar.update(0, 4)
    bar.update(6, 4, "12 events")  # more than counted: the count is an estimate
    bar.close()
    final = err.getvalue().rstrip("\n").split("\r")[-1]
    assert "6/6" in final and "12 events" in final
