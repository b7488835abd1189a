"""Workflows with real ``runworker`` processes on the real database (both backends), and the
concurrent-finish race on PostgreSQL.

What each test asserts comes from the runs' own rows: the worker writes ``started_at`` and
``finished_at`` just around the task call, so they bound each node's body. Every wait is a
bounded poll of the database.
"""

from __future__ import annotations

import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connections

from distsched_app import workflows
from distsched_app.models import EventType, Run, RunEvent, RunState, Worker, Workflow, WorkflowState
from distsched_app.services import claiming, runs
from tests.concurrency.procs import child_env, finish, manage, wait_for
from tests.factories import succeed
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BOOT = 90  # seconds a child process may take to start on a loaded machine


class Workers:
    """Real ``runworker`` children, output to one log file each."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.procs: dict[str, subprocess.Popen] = {}
        self.killed: set[str] = set()

    def start(self, count: int, *args: str) -> list[str]:
        names = []
        for _ in range(count):
            name = f"w{len(self.procs)}"
            with (self.directory / f"{name}.log").open("w") as log:
                self.procs[name] = manage(
                    "runworker", f"--worker-id={name}", "--poll-interval=0.2", *args,
                    env=child_env(), stdout=log, stderr=subprocess.STDOUT,
                )  # fmt: skip
            names.append(name)
        # Registered means its signal handlers are in place: a SIGTERM from stop() is a graceful stop,
        # not the death of a process still importing Django.
        registered = wait_for(lambda: Worker.objects.filter(worker_id__in=names).count() == len(names), timeout=BOOT)
        assert registered, self.logs()
        return names

    def kill(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait(timeout=30)
        self.killed.add(name)

    def logs(self) -> str:
        return "\n".join(
            f"--- {n}\n" + "\n".join((self.directory / f"{n}.log").read_text(errors="replace").splitlines()[-15:])
            for n in self.procs
        )

    def stop(self) -> None:
        live = [p for n, p in self.procs.items() if n not in self.killed]
        for proc in live:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        bad = [code for code, _, _ in finish(live, timeout=60) if code != 0]
        self.procs = {n: p for n, p in self.procs.items() if n in self.killed}
        assert not bad, f"worker exit codes {bad}\n{self.logs()}"


@pytest.fixture
def group(tmp_path) -> Iterator[Workers]:
    made = Workers(tmp_path)
    yield made
    for proc in made.procs.values():  # a failed test's children must not outlive it
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def finished(workflow_id: int) -> Callable[[], bool]:
    return lambda: Workflow.objects.filter(pk=workflow_id, finished_at__isnull=False).exists()


def run(run_id: int) -> Run:
    return Run.objects.get(pk=run_id)


def test_chain_in_order_and_fan_out_side_by_side_with_a_join_that_waits_for_both(group):
    slow = {"task": "tests.record", "kwargs": {"sleep": 1.0}}
    wf = workflows.enqueue(
        {"name": "diamond", "nodes": [
            {"id": "a", "task": "tests.record"},
            {"id": "b", **slow, "after": ["a"]},
            {"id": "c", **slow, "after": ["a"]},
            {"id": "join", "task": "tests.record", "after": ["b", "c"]},
            {"id": "after_join", "task": "tests.record", "after": ["join"]},
        ]}
    )  # fmt: skip
    group.start(2, "--prefetch=1")  # each worker holds one run at a time: the branches go to both
    try:
        assert wait_for(finished(wf.id), timeout=BOOT + 60), group.logs()
    finally:
        group.stop()
    assert Workflow.objects.get(pk=wf.id).state == WorkflowState.SUCCEEDED
    a, b, c, join, last = (run(wf.runs[n]) for n in ("a", "b", "c", "join", "after_join"))
    assert a.finished_at <= b.started_at and a.finished_at <= c.started_at
    assert b.started_at < c.finished_at and c.started_at < b.finished_at  # side by side on two workers
    assert join.started_at >= max(b.finished_at, c.finished_at)  # the join waited for both
    assert last.started_at >= join.finished_at
    assert Execution.objects.count() == 5  # each node once


def test_dead_upstream_skips_its_downstream_a_run_node_runs_and_requeue_reopens(group):
    wf = workflows.enqueue(
        {"name": "failing", "nodes": [
            {"id": "a", "task": "tests.fail", "max_attempts": 1},
            {"id": "b", "task": "tests.record", "after": ["a"]},
            {"id": "c", "task": "tests.record", "after": ["b"]},
            {"id": "cleanup", "task": "tests.record", "after": ["a"], "on_upstream_failure": "run"},
        ]}
    )  # fmt: skip
    group.start(2)
    try:
        assert wait_for(finished(wf.id), timeout=BOOT + 60), group.logs()
        assert Workflow.objects.get(pk=wf.id).state == WorkflowState.FAILED
        assert [run(wf.runs[n]).state for n in ("a", "b", "c", "cleanup")] == [
            "dead",
            "skipped",
            "skipped",
            "succeeded",
        ]
        assert not Execution.objects.filter(run_id__in=[wf.runs["b"], wf.runs["c"]]).exists()
        # The upstream's bug is fixed: requeue it, and what it ended runs.
        Run.objects.filter(pk=wf.runs["a"]).update(task_name="tests.record")
        runs.requeue_run(wf.runs["a"], now=run(wf.runs["a"]).finished_at)
        assert wait_for(
            lambda: Workflow.objects.filter(pk=wf.id, state=WorkflowState.SUCCEEDED).exists(), timeout=60
        ), group.logs()
    finally:
        group.stop()
    assert [run(wf.runs[n]).state for n in ("a", "b", "c")] == ["succeeded"] * 3
    assert Execution.objects.filter(run_id=wf.runs["cleanup"]).count() == 1  # not run again


def test_a_retrying_upstream_holds_its_downstream(group):
    wf = workflows.enqueue(
        {"name": "retry", "nodes": [
            {"id": "a", "task": "tests.record", "kwargs": {"fail_attempts": 1}, "max_attempts": 3,
             "retry_base_seconds": 1, "retry_max_seconds": 1},
            {"id": "b", "task": "tests.record", "after": ["a"]},
        ]}
    )  # fmt: skip
    group.start(1)
    try:
        assert wait_for(finished(wf.id), timeout=BOOT + 60), group.logs()
    finally:
        group.stop()
    a, b = run(wf.runs["a"]), run(wf.runs["b"])
    assert (a.state, a.attempts, b.state) == ("succeeded", 2, "succeeded")
    assert b.started_at >= a.finished_at
    first_failure = RunEvent.objects.get(run_id=a.pk, event_type=EventType.FAILED).created_at
    assert b.started_at > first_failure


def test_a_sigkilled_worker_mid_upstream_does_not_break_the_workflow(group):
    wf = workflows.enqueue(
        {"name": "crash", "nodes": [
            {"id": "a", "task": "tests.record_slow_first", "kwargs": {"first_sleep": 60}},
            {"id": "b", "task": "tests.record", "after": ["a"]},
        ]}
    )  # fmt: skip
    lease = ("--lease-seconds=2", "--heartbeat-seconds=0.5")
    [first] = group.start(1, *lease)
    try:
        assert wait_for(lambda: Execution.objects.filter(run_id=wf.runs["a"]).exists(), timeout=BOOT), group.logs()
        group.kill(first)
        assert run(wf.runs["b"]).state == RunState.BLOCKED
        group.start(1, *lease)
        assert wait_for(finished(wf.id), timeout=BOOT + 60), group.logs()
    finally:
        group.stop()
    assert Workflow.objects.get(pk=wf.id).state == WorkflowState.SUCCEEDED
    a, b = run(wf.runs["a"]), run(wf.runs["b"])
    assert a.attempts == 2 and b.started_at >= a.finished_at
    assert Execution.objects.filter(run_id=b.pk).count() == 1


LOOPS = 400


def _finish_together(barrier: threading.Barrier, worker: str, run: Run, at) -> None:
    """One worker's success, recorded on this thread's own connection once the other is ready too."""
    try:
        barrier.wait(timeout=30)
        succeed(run.pk, worker_id=worker, attempt=run.attempts, now=at)
    finally:
        connections.close_all()


@pytest.mark.postgres
def test_two_upstreams_finishing_at_once_release_the_join_exactly_once():
    """Two upstreams of one join succeed at the same instant in two transactions (two connections),
    ``LOOPS`` times; every time the join is released once and the workflow of two sinks closes."""
    from distsched_app.clock import system_clock

    failures: list[str] = []
    for i in range(LOOPS):
        join = i % 2 == 0  # even loops: a join; odd: two sinks (the workflow's close races instead)
        nodes = [{"id": "u1", "task": "tests.noop"}, {"id": "u2", "task": "tests.noop"}]
        if join:
            nodes.append({"id": "j", "task": "tests.noop", "after": ["u1", "u2"]})
        wf = workflows.enqueue({"name": f"race-{i}", "nodes": nodes})
        at = system_clock.now()
        claimed = {
            name: claiming.claim_runs(worker_id=name, queues=None, lease_seconds=60, now=at, limit=1)[0]
            for name in ("t1", "t2")
        }
        barrier = threading.Barrier(2)
        threads = [
            threading.Thread(target=_finish_together, args=(barrier, name, run, at)) for name, run in claimed.items()
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        if join:
            released = RunEvent.objects.filter(run_id=wf.runs["j"], event_type=EventType.UNBLOCKED).count()
            if (Run.objects.get(pk=wf.runs["j"]).state, released) != (RunState.PENDING, 1):
                failures.append(f"loop {i}: join {Run.objects.get(pk=wf.runs['j']).state}, released {released}x")
            Run.objects.filter(pk=wf.runs["j"]).update(state=RunState.CANCELLED)  # keep the next claims clean
        elif Workflow.objects.get(pk=wf.id).state != WorkflowState.SUCCEEDED:
            failures.append(f"loop {i}: workflow {Workflow.objects.get(pk=wf.id).state} after both sinks ended")
    assert not failures, failures[:10]
