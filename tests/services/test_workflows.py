"""Workflows in one process: validation, release, failure rules, requeue, cancel, sweep, results."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from distsched_app import workflows
from distsched_app.errors import DistschedError, InvalidStateTransition, ValidationError
from distsched_app.models import (
    EventType,
    Run,
    RunEvent,
    RunState,
    Workflow,
    WorkflowEdge,
    WorkflowNode,
    WorkflowState,
)
from distsched_app.services import claiming, outcomes, runs, workflow_ops, workflow_release
from tests.factories import succeed
from tests.testapp import tasks as test_tasks

pytestmark = pytest.mark.django_db


def node(node_id, task="tests.upstream", **options):
    return {"id": node_id, "task": task, **options}


def state(run_id: int) -> str:
    return Run.objects.get(pk=run_id).state


def drain(scheduler, worker_id="w1", limit=50) -> list[int]:
    """Execute due runs one by one with a real worker; the run ids in execution order."""
    worker = scheduler.worker(worker_id=worker_id)
    order = []
    for _ in range(limit):
        done = worker.run_once()
        if done is None:
            return order
        order.append(done.run_id)
    raise AssertionError("the workflow did not drain")


def claim(clock, worker="w1"):
    return claiming.claim_next_run(worker_id=worker, queues=None, lease_seconds=30, now=clock.now())


def fail_final(run, clock, worker="w1"):
    return outcomes.record_failure(
        run_id=run.pk, worker_id=worker, attempt=run.attempts, now=clock.now(), error="boom", final=True
    )


# ----------------------------------------------------------------- validation: nothing written


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"name": "x", "nodes": []}, "nodes", "at least one node"),
        ({"name": "", "nodes": [node("a")]}, "name", "name"),
        ({"name": "x", "nodes": [node("a"), node("a")]}, "nodes.1.id", "used twice"),
        ({"name": "x", "nodes": [node("a", after=["zz"])]}, "nodes.0.after", "unknown node 'zz'"),
        ({"name": "x", "nodes": [node("a", after=["b"]), node("b", after=["a"])]}, "nodes", "cycle"),
        ({"name": "x", "nodes": [node("a", after=["a"])]}, "nodes.0.after", "itself"),
        ({"name": "x", "nodes": [node("a", task="nope.missing")]}, "nodes.0.task", "nope.missing"),
        ({"name": "x", "nodes": [node("a", args=[object()])]}, "nodes.0.args", "args"),
        ({"name": "x", "nodes": [node("a", kwargs={"t": "\x00"})]}, "nodes.0.kwargs", ""),
        ({"name": "x", "nodes": [node("a", on_upstream_failure="maybe")]}, "nodes.0.on_upstream_failure", "run"),
        ({"name": "x", "nodes": [node("a", colour="red")]}, "nodes.0", "colour"),
        ({"name": "x", "nodes": [node("a", priority=1000)]}, "nodes.0.priority", "priority"),
    ],
)
def test_an_invalid_spec_raises_and_writes_nothing(spec, field, words):
    with pytest.raises(ValidationError) as caught:
        workflows.enqueue(spec)
    assert isinstance(caught.value, DistschedError)
    assert caught.value.field == field
    assert words in caught.value.message
    assert not Workflow.objects.exists()
    assert not Run.objects.exists()
    assert not WorkflowEdge.objects.exists()


def test_enqueue_writes_runs_nodes_and_edges_with_waiting_nodes_unclaimable(clock):
    wf = workflows.enqueue(
        {"name": "onboard", "nodes": [node("fetch"), node("bill", after=["fetch"]), node("mail", after=["fetch"])]},
        clock=clock,
    )
    assert set(wf.runs) == {"fetch", "bill", "mail"}
    assert Workflow.objects.get(pk=wf.id).state == WorkflowState.RUNNING
    fetch, bill, mail = (Run.objects.get(pk=wf.runs[n]) for n in ("fetch", "bill", "mail"))
    assert fetch.state == RunState.PENDING and fetch.workflow_id == wf.id
    assert (bill.state, bill.held_by) == (RunState.BLOCKED, f"workflow:{wf.id}")
    assert bill.pk > fetch.pk and mail.pk > fetch.pk  # topological order
    assert WorkflowEdge.objects.filter(upstream=fetch).count() == 2
    # Only the upstream is claimable; the waiting ones hold no lease and no attempt.
    claimed = claim(clock)
    assert claimed.pk == fetch.pk
    assert claim(clock, worker="w2") is None
    bill.refresh_from_db()
    assert (bill.attempts, bill.lease_owner) == (0, "")


def test_builder_makes_the_same_spec_as_the_dict(clock):
    built = (
        workflows.Workflow("w")
        .node("a", "tests.upstream", kwargs={"value": 1})
        .node("b", test_tasks.upstream, after=["a"], on_upstream_failure="run", queue="other", priority=5)
    )
    assert built.spec() == {
        "name": "w",
        "nodes": [
            {"id": "a", "task": "tests.upstream", "args": [], "kwargs": {"value": 1}, "after": [],
             "on_upstream_failure": "cancel"},
            {"id": "b", "task": "tests.upstream", "args": [], "kwargs": {}, "after": ["a"],
             "on_upstream_failure": "run", "queue": "other", "priority": 5},
        ],
    }  # fmt: skip
    wf = built.enqueue(clock=clock)
    b = Run.objects.get(pk=wf.runs["b"])
    assert (b.queue, b.priority) == ("other", 5)
    assert WorkflowNode.objects.get(run=b).on_upstream_failure == "run"


# ----------------------------------------------------------------- running: order and results


def test_a_chain_runs_in_order_and_passes_results_by_name(scheduler, clock):
    wf = workflows.enqueue(
        {"name": "chain", "nodes": [
            node("c", after=["b"], kwargs={"value": "C"}),
            node("a", kwargs={"value": {"n": 1}}),
            node("b", after=["a"], kwargs={"value": "B"}),
        ]},
        clock=clock,
    )  # fmt: skip
    order = drain(scheduler)
    assert order == [wf.runs["a"], wf.runs["b"], wf.runs["c"]]
    upstream = {call["run_id"]: call["upstream"] for call in test_tasks.CALLS}
    assert upstream[wf.runs["a"]] == {}
    assert upstream[wf.runs["b"]] == {"a": {"n": 1}}
    assert upstream[wf.runs["c"]] == {"b": "B"}
    row = Workflow.objects.get(pk=wf.id)
    assert (row.state, row.finished_at) == (WorkflowState.SUCCEEDED, clock.now())


def test_fan_out_then_join_waits_for_every_branch(clock):
    wf = workflows.enqueue(
        {"name": "diamond", "nodes": [
            node("a"), node("b", after=["a"]), node("c", after=["a"]), node("join", after=["b", "c"]),
        ]},
        clock=clock,
    )  # fmt: skip
    a = claim(clock)
    assert succeed(a, worker_id="w1", attempt=1, now=clock.now(), result=1)
    b, c = claim(clock, "w1"), claim(clock, "w2")  # side by side: both claimable at once
    assert {b.pk, c.pk} == {wf.runs["b"], wf.runs["c"]}
    assert succeed(b, worker_id="w1", attempt=1, now=clock.now())
    assert state(wf.runs["join"]) == RunState.BLOCKED  # one branch still running
    assert claim(clock, "w3") is None
    assert succeed(c, worker_id="w2", attempt=1, now=clock.now())
    assert state(wf.runs["join"]) == RunState.PENDING
    kinds = RunEvent.objects.filter(run_id=wf.runs["join"]).values_list("event_type", flat=True)
    assert list(kinds).count(EventType.UNBLOCKED) == 1


def test_a_dead_upstream_ends_its_downstream_but_a_run_node_still_runs(scheduler, clock):
    wf = workflows.enqueue(
        {"name": "f", "nodes": [
            node("a", task="tests.fail", max_attempts=1),
            node("b", after=["a"]),
            node("c", after=["b"]),
            node("finally", after=["b"], on_upstream_failure="run"),
        ]},
        clock=clock,
    )  # fmt: skip
    drain(scheduler)
    assert state(wf.runs["a"]) == RunState.DEAD
    assert state(wf.runs["b"]) == RunState.SKIPPED
    assert state(wf.runs["c"]) == RunState.SKIPPED  # transitively
    assert state(wf.runs["finally"]) == RunState.SUCCEEDED
    skipped = RunEvent.objects.get(run_id=wf.runs["b"], event_type=EventType.SKIPPED).message
    assert "'a'" in skipped and f"run {wf.runs['a']}" in skipped and "dead" in skipped
    assert Run.objects.get(pk=wf.runs["b"]).attempts == 0  # never ran
    assert WorkflowNode.objects.get(run_id=wf.runs["c"]).ended_by == wf.runs["b"]
    assert Workflow.objects.get(pk=wf.id).state == WorkflowState.FAILED


def test_requeueing_the_dead_upstream_reopens_what_it_ended(scheduler, clock):
    wf = workflows.enqueue(
        {"name": "f", "nodes": [
            node("a", task="tests.fail", max_attempts=1), node("b", after=["a"]), node("c", after=["b"]),
        ]},
        clock=clock,
    )  # fmt: skip
    drain(scheduler)
    assert Workflow.objects.get(pk=wf.id).state == WorkflowState.FAILED
    # The task is fixed: its next run succeeds.
    Run.objects.filter(pk=wf.runs["a"]).update(task_name="tests.upstream")
    runs.requeue_run(wf.runs["a"], now=clock.now())
    assert state(wf.runs["b"]) == RunState.BLOCKED and state(wf.runs["c"]) == RunState.BLOCKED
    row = Workflow.objects.get(pk=wf.id)
    assert (row.state, row.finished_at) == (WorkflowState.RUNNING, None)
    drain(scheduler)
    assert [state(wf.runs[n]) for n in "abc"] == [RunState.SUCCEEDED] * 3
    assert Workflow.objects.get(pk=wf.id).state == WorkflowState.SUCCEEDED


def test_a_skipped_node_cannot_be_requeued_behind_its_dead_upstream(scheduler, clock):
    wf = workflows.enqueue(
        {"name": "f", "nodes": [node("a", task="tests.fail", max_attempts=1), node("b", after=["a"])]}, clock=clock
    )
    drain(scheduler)
    Run.objects.filter(pk=wf.runs["b"]).update(state=RunState.CANCELLED)  # requeue takes dead/cancelled
    with pytest.raises(InvalidStateTransition, match="requeue that run instead"):
        runs.requeue_run(wf.runs["b"], now=clock.now())
    assert state(wf.runs["b"]) == RunState.CANCELLED


def test_a_retrying_upstream_holds_its_downstream(scheduler, clock):
    wf = workflows.enqueue(
        {"name": "r", "nodes": [
            node("a", max_attempts=3, retry_base_seconds=10, retry_max_seconds=10), node("b", after=["a"]),
        ]},
        clock=clock,
    )  # fmt: skip
    a = claim(clock)
    assert outcomes.record_failure(run_id=a.pk, worker_id="w1", attempt=1, now=clock.now(), error="x") == "retrying"
    assert state(wf.runs["b"]) == RunState.BLOCKED
    clock.advance(seconds=11)
    a = claim(clock)
    assert a.pk == wf.runs["a"]  # the same run, its second attempt: the chain is intact
    assert succeed(a, worker_id="w1", attempt=2, now=clock.now())
    assert state(wf.runs["b"]) == RunState.PENDING


def test_lease_recovery_to_dead_ends_the_downstream(clock):
    wf = workflows.enqueue({"name": "l", "nodes": [node("a", max_attempts=1), node("b", after=["a"])]}, clock=clock)
    claim(clock, "gone")
    clock.advance(seconds=31)
    assert claim(clock, "w2") is None  # recovered dead, not re-run
    assert state(wf.runs["a"]) == RunState.DEAD
    assert state(wf.runs["b"]) == RunState.SKIPPED
    assert Workflow.objects.get(pk=wf.id).state == WorkflowState.FAILED


def test_cancelling_an_upstream_run_ends_its_downstream(clock):
    wf = workflows.enqueue({"name": "c", "nodes": [node("a"), node("b", after=["a"])]}, clock=clock)
    runs.cancel_run(wf.runs["a"], now=clock.now())
    assert state(wf.runs["b"]) == RunState.SKIPPED
    assert Workflow.objects.get(pk=wf.id).state == WorkflowState.FAILED


def test_cancel_workflow_cancels_every_unfinished_node(clock):
    wf = workflows.enqueue(
        {"name": "c", "nodes": [node("a"), node("b"), node("c", after=["a"]), node("d", after=["c"],
                                on_upstream_failure="run")]},
        clock=clock,
    )  # fmt: skip
    running = claim(clock)  # a is running: asked to stop
    assert running.pk == wf.runs["a"]
    row = workflows.cancel(wf.id, clock=clock)
    assert row.state == WorkflowState.CANCELLED and row.finished_at is None  # a still runs
    assert [state(wf.runs[n]) for n in "bcd"] == [RunState.CANCELLED] * 3
    assert Run.objects.get(pk=wf.runs["a"]).cancel_requested
    outcomes.record_failure(run_id=running.pk, worker_id="w1", attempt=1, now=clock.now(), error="x", cancelled=True)
    row.refresh_from_db()
    assert (row.state, row.finished_at) == (WorkflowState.CANCELLED, clock.now())
    with pytest.raises(InvalidStateTransition):
        workflows.cancel(wf.id, clock=clock)


def test_a_run_outside_any_workflow_pays_no_workflow_query(clock):
    from distsched_app.services.enqueue import Job, enqueue

    run = enqueue(Job(task_name="tests.noop"), now=clock.now()).run
    claim(clock)
    with CaptureQueriesContext(connection) as queries:
        assert succeed(run.pk, worker_id="w1", attempt=1, now=clock.now())
    # The fencing read carries the run's workflow column; no statement touches a workflow table.
    assert not [q for q in queries.captured_queries if "distsched_app_workflow" in q["sql"]]
    assert len(queries.captured_queries) <= 6


def test_a_finish_reads_only_its_own_downstream_in_a_bounded_number_of_statements(clock):
    n = 200
    nodes = [node(f"u{i}") for i in range(n)] + [node("join", after=[f"u{i}" for i in range(n)])]
    wf = workflows.enqueue({"name": "fan-in", "nodes": nodes}, clock=clock)
    counts = []
    for i in (0, 1, n - 2):
        run_id = wf.runs[f"u{i}"]
        Run.objects.filter(pk=run_id).update(
            state=RunState.RUNNING, lease_owner="w", attempts=1, started_at=clock.now()
        )
        with CaptureQueriesContext(connection) as queries:
            assert succeed(run_id, worker_id="w", attempt=1, now=clock.now())
        counts.append(len(queries.captured_queries))
    assert counts[0] == counts[1] == counts[2]  # the same statements early and late: no sibling scan
    assert state(wf.runs["join"]) == RunState.BLOCKED


def test_a_finish_never_scans_the_edge_table_on_sqlite(clock):
    """The same count of statements can still read every sibling: with statistics taken while
    every edge of a fan-in waited, SQLite's planner chose a scan of the whole edge table for "does
    the join still wait?" on every finish. Every statement of a finish that reads the edges must
    search an index."""
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's plans (PostgreSQL's EXISTS probe stops at the first waiting edge)")
    n = 200
    nodes = [node(f"u{i}") for i in range(n)] + [node("join", after=[f"u{i}" for i in range(n)])]
    wf = workflows.enqueue({"name": "fan-in", "nodes": nodes}, clock=clock)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # statistics of a fan-in whose every edge waits
    run_id = wf.runs["u0"]
    Run.objects.filter(pk=run_id).update(state=RunState.RUNNING, lease_owner="w", attempts=1, started_at=clock.now())
    with CaptureQueriesContext(connection) as queries:
        assert succeed(run_id, worker_id="w", attempt=1, now=clock.now())
    edge_statements = [q["sql"] for q in queries.captured_queries if "distsched_app_workflowedge" in q["sql"]]
    assert edge_statements
    with connection.cursor() as cursor:
        for sql in edge_statements:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}")
            plan = [row[-1] for row in cursor.fetchall()]
            assert not [step for step in plan if step.startswith("SCAN") and "json_each" not in step], (sql, plan)


def test_the_sweep_releases_what_a_missed_transition_left_waiting(clock):
    wf = workflows.enqueue({"name": "s", "nodes": [node("a"), node("b", after=["a"])]}, clock=clock)
    # A finish recorded without its release (as by a bug or a hand edit).
    Run.objects.filter(pk=wf.runs["a"]).update(state=RunState.SUCCEEDED, finished_at=clock.now())
    assert state(wf.runs["b"]) == RunState.BLOCKED
    assert workflow_release.sweep(clock.now()) == 1
    assert state(wf.runs["b"]) == RunState.PENDING
    assert workflow_release.sweep(clock.now()) == 0


def test_the_sweep_closes_a_workflow_whose_nodes_all_ended(clock):
    wf = workflows.enqueue({"name": "s", "nodes": [node("a")]}, clock=clock)
    Run.objects.filter(pk=wf.runs["a"]).update(state=RunState.SUCCEEDED, finished_at=clock.now())
    workflow_release.sweep(clock.now())
    assert Workflow.objects.get(pk=wf.id).state == WorkflowState.SUCCEEDED


def test_nodes_view_lists_ids_runs_states_and_after(clock):
    wf = workflows.enqueue({"name": "v", "nodes": [node("a"), node("b", after=["a"])]}, clock=clock)
    views = workflow_ops.nodes(Workflow.objects.get(pk=wf.id))
    assert [(v.id, v.run, v.state, v.after) for v in views] == [
        ("a", wf.runs["a"], "pending", ()),
        ("b", wf.runs["b"], "blocked", ("a",)),
    ]


# ----------------------------------------------------------------- prune: whole workflows only


def test_prune_removes_whole_finished_workflows_and_never_part_of_a_live_one(scheduler, clock):
    from datetime import timedelta

    from distsched_app.services import maintenance

    done = workflows.enqueue({"name": "done", "nodes": [node("a"), node("b", after=["a"])]}, clock=clock)
    drain(scheduler)
    live = workflows.enqueue({"name": "live", "nodes": [node("a"), node("b", after=["a"])]}, clock=clock)
    assert succeed(claim(clock), worker_id="w1", attempt=1, now=clock.now())  # live's a ends; b is pending
    assert Workflow.objects.get(pk=done.id).state == WorkflowState.SUCCEEDED
    assert (state(live.runs["a"]), state(live.runs["b"])) == (RunState.SUCCEEDED, RunState.PENDING)
    clock.advance(days=40)
    preview = maintenance.prune_runs(older_than=timedelta(days=30), now=clock.now(), dry_run=True)
    assert (preview.workflows, preview.runs) == (1, 2)
    result = maintenance.prune_runs(older_than=timedelta(days=30), now=clock.now())
    assert (result.workflows, result.runs) == (1, 2)
    assert not Workflow.objects.filter(pk=done.id).exists()
    assert not Run.objects.filter(pk__in=done.runs.values()).exists()
    assert not WorkflowNode.objects.filter(workflow_id=done.id).exists()
    # The live workflow's finished node is old enough, but its workflow is not finished: kept.
    assert Run.objects.filter(pk__in=live.runs.values()).count() == 2
    assert WorkflowEdge.objects.filter(downstream_id=live.runs["b"]).exists()


def test_a_framework_task_node_reads_upstream_results_from_its_task_context(scheduler, clock):
    wf = (
        workflows.Workflow("framework")
        .node("a", "tests.upstream", kwargs={"value": 5})
        .node("b", test_tasks.ft_upstream, after=["a"])  # a django.tasks Task object
        .enqueue(clock=clock)
    )
    drain(scheduler)
    b = Run.objects.get(pk=wf.runs["b"])
    assert (b.state, b.result) == (RunState.SUCCEEDED, {"a": 5})


def test_explain_names_the_upstream_nodes_a_node_still_waits_for(clock):
    from distsched_app.services import explain

    wf = workflows.enqueue({"name": "e", "nodes": [node("a"), node("b"), node("join", after=["a", "b"])]}, clock=clock)
    assert succeed(claim(clock), worker_id="w1", attempt=1, now=clock.now())  # a ended; b has not
    join = Run.objects.get(pk=wf.runs["join"])
    [reason] = explain.explain(join, now=clock.now())["waiting_for"]
    assert reason["kind"] == "upstream" and reason["workflow"] == wf.id
    assert reason["upstream"] == [{"node": "b", "run": wf.runs["b"], "state": "pending"}]
    assert "waiting for b" in reason["message"]


def test_the_limit_and_replacement_sweeps_leave_waiting_nodes_alone(clock, settings):
    from distsched_app.services import limits

    settings.DISTSCHED = {**settings.DISTSCHED, "LIMITS": {"one": {"task": "tests.upstream", "concurrency": 1}}}
    wf = workflows.enqueue({"name": "s", "nodes": [node("a"), node("b", after=["a"])]}, clock=clock)
    limits.sweep(clock.now())
    assert (state(wf.runs["b"]), Run.objects.get(pk=wf.runs["b"]).held_by) == (RunState.BLOCKED, f"workflow:{wf.id}")
    # Once released, the node is an ordinary pending run under the limit: the claim admits it.
    a = claim(clock)
    assert succeed(a, worker_id="w1", attempt=1, now=clock.now())
    assert state(wf.runs["b"]) == RunState.PENDING
    assert claim(clock).pk == wf.runs["b"]
