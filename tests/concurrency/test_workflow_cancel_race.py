"""An operator cancels while workers finish upstream nodes, at the same instant, on PostgreSQL.

Each loop enqueues workflow A (four upstreams, a join after them, a tail after the join) and
workflow B (two lone nodes), lets two "workers" claim A's upstreams and B's nodes in alternation
(each holds a batch that spans both workflows), then three threads, each on its own connection,
start together: two record their batch's successes (``record_successes``: the batch's rows
locked, then the join, then the workflow's row), the third is the operator. The operator, in
turn: cancels workflow A; cancels A's join alone; cancels A's join and one of B's running runs
in one batch (``cancel_many``, as a bulk action does: the waiting join is locked before the
running run a worker holds, while that worker holds the run and waits for the join).

No call may fail (a deadlock PostgreSQL detects aborts one of them), and the outcome must be the
one the rules give whatever the interleaving: the join and the tail never run, every upstream
succeeds (a cancel request does not stop a success), the workflows end in their stated state.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from django.db import connections, transaction

from distsched_app import workflows
from distsched_app.clock import system_clock
from distsched_app.models import ACTIVE_STATES, EventType, Run, RunEvent, RunState, Workflow, WorkflowState
from distsched_app.services import claiming, outcomes, runs, workflow_ops
from distsched_app.services.workflows import Enqueued

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.postgres]

LOOPS = 150  # 50 of each operator action


def _spec(name: str) -> dict:
    ups = [{"id": f"u{k}", "task": "tests.noop"} for k in range(4)]
    return {
        "name": name,
        "nodes": [
            *ups,
            {"id": "j", "task": "tests.noop", "after": [u["id"] for u in ups]},
            {"id": "t", "task": "tests.noop", "after": ["j"]},
        ],
    }


def _in_thread(barrier: threading.Barrier, errors: list[str], label: str, fn: Callable[[], object]) -> None:
    try:
        barrier.wait(timeout=30)
        fn()
    except Exception as exc:  # noqa: BLE001 - reported by the test
        errors.append(f"{label}: {type(exc).__name__}: {exc}")
    finally:
        connections.close_all()


def _finish(worker: str, batch: list[Run]) -> Callable[[], object]:
    def go() -> object:
        now = system_clock.now()
        successes = [
            outcomes.Success(run_id=r.pk, attempt=r.attempts, started_at=r.started_at or now, finished_at=now)
            for r in batch
        ]
        lost = outcomes.record_successes(worker_id=worker, successes=successes, now=now)
        assert not lost, f"{worker} lost {sorted(lost)}"
        return lost

    return go


def _operator(kind: int, a: Enqueued, b_running: int) -> Callable[[], object]:
    def go() -> object:
        now = system_clock.now()
        if kind == 0:
            return workflow_ops.cancel_workflow(a.id, now=now)
        if kind == 1:
            return runs.cancel_run(a.runs["j"], now=now)
        with transaction.atomic():  # one batch of a bulk cancel
            return runs.cancel_many([a.runs["j"], b_running], now=now, reason="by the race test")

    return go


def _expected(kind: int, a: Enqueued, b: Enqueued) -> list[str]:
    """What is wrong with this loop's outcome (nothing, if the rules held)."""
    state = dict(Run.objects.filter(pk__in=[*a.runs.values(), *b.runs.values()]).values_list("id", "state"))
    wrong = []
    for node in ("u0", "u1", "u2", "u3"):
        if state[a.runs[node]] != RunState.SUCCEEDED:
            wrong.append(f"A.{node} {state[a.runs[node]]}")
    tail = RunState.CANCELLED if kind == 0 else RunState.SKIPPED
    if (state[a.runs["j"]], state[a.runs["t"]]) != (RunState.CANCELLED, tail):
        wrong.append(f"A.j {state[a.runs['j']]}, A.t {state[a.runs['t']]} (expected cancelled, {tail})")
    released = RunEvent.objects.filter(run_id=a.runs["j"], event_type=EventType.UNBLOCKED).count()
    if released > 1:
        wrong.append(f"A.j released {released}x")
    for node, run_id in b.runs.items():
        if state[run_id] != RunState.SUCCEEDED:
            wrong.append(f"B.{node} {state[run_id]}")
    wf = dict(Workflow.objects.filter(pk__in=[a.id, b.id]).values_list("id", "state"))
    open_ = Workflow.objects.filter(pk__in=[a.id, b.id], finished_at__isnull=True).count()
    a_state = WorkflowState.CANCELLED if kind == 0 else WorkflowState.FAILED
    if (wf[a.id], wf[b.id], open_) != (a_state, WorkflowState.SUCCEEDED, 0):
        wrong.append(f"workflows A {wf[a.id]}, B {wf[b.id]}, {open_} unfinished (expected {a_state}, succeeded, 0)")
    return wrong


def test_cancel_racing_finishes_neither_deadlocks_nor_breaks_the_rules():
    failures: list[str] = []
    for i in range(LOOPS):
        kind = i % 3
        a = workflows.enqueue(_spec(f"cancel-race-a-{i}"))
        b = workflows.enqueue({"name": f"cancel-race-b-{i}", "nodes": [{"id": "b0", "task": "tests.noop"},
                                                                      {"id": "b1", "task": "tests.noop"}]})  # fmt: skip
        at = system_clock.now()
        batches: dict[str, list[Run]] = {"w1": [], "w2": []}
        for k in range(6):  # w1: A.u0, A.u2, B.b0; w2: A.u1, A.u3, B.b1
            worker = "w1" if k % 2 == 0 else "w2"
            batches[worker] += claiming.claim_runs(worker_id=worker, queues=None, lease_seconds=60, now=at, limit=1)
        assert [r.pk for r in batches["w2"]] == [a.runs["u1"], a.runs["u3"], b.runs["b1"]], batches
        errors: list[str] = []
        barrier = threading.Barrier(3)
        threads = [
            threading.Thread(target=_in_thread, args=(barrier, errors, "w1", _finish("w1", batches["w1"]))),
            threading.Thread(target=_in_thread, args=(barrier, errors, "w2", _finish("w2", batches["w2"]))),
            threading.Thread(target=_in_thread, args=(barrier, errors, "operator", _operator(kind, a, b.runs["b1"]))),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads), f"loop {i}: a thread is still waiting after 60 s"
        wrong = errors + _expected(kind, a, b)
        if wrong:
            failures.append(f"loop {i} (operator action {kind}): {'; '.join(wrong)}")
            # Leave nothing claimable behind for the next loop's claims.
            Run.objects.filter(state__in=ACTIVE_STATES).update(state=RunState.CANCELLED, lease_owner="")
    assert not failures, f"{len(failures)}/{LOOPS} loops failed: {failures[:6]}"
