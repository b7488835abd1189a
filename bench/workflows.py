"""Workflows: enqueue time of a large fan-in, drain rate next to plain runs, statements per finish.

    .venv/bin/python bench/workflows.py --db sqlite --nodes 10000 --workers 4 --repeat 2
    .venv/bin/python bench/workflows.py --db postgres --nodes 10000 --workers 4 --repeat 2

Three measurements, side by side in one run:

- **enqueue**: ``workflows.enqueue`` of a fan-in (N upstream nodes of the no-op task, one join
  after all of them): one transaction, validation included; next to ``enqueue_many`` of N+1 plain
  runs (the bulk path of the task framework's backend). Median of ``--repeat``.
- **drain**: K real ``runworker --burst`` processes execute the workflow (the join last) and,
  in alternating legs, N+1 plain enqueued runs. *window runs/s* = runs / (first ``claimed`` event
  .. last ``succeeded`` event); the ratio workflow / plain is the cost of releasing downstream
  nodes in the finishing transactions (goal: >= 80%). *worker CPU ms/run*: the worker processes'
  user + system CPU (``RUSAGE_CHILDREN``) per run, start-up included; on SQLite it holds the
  database's work too. On a shared machine it varies less than the window.
- **statements per finish**: the statements of ``record_successes`` for one upstream of a
  fan-in early (all siblings waiting) and late (all siblings done but one), and for a plain run:
  equal early and late means a finish reads only its own downstream, never its siblings.
"""

from __future__ import annotations

import resource
import shlex
import sys
import time

import _common as c

NAME = "workflows"


def main() -> int:
    p = c.parser(__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=10_000, help="N upstream nodes of the fan-in.")
    p.add_argument("--workers", type=int, default=4, help="K worker processes for the drain.")
    p.add_argument("--repeat", type=int, default=2, help="Repetitions of each leg; medians are reported.")
    p.add_argument("--poll-interval", type=float, default=0.05)
    p.add_argument("--worker-args", default="", help='Extra runworker flags, e.g. "--prefetch 16".')
    p.add_argument("--skip-drain", action="store_true", help="Only enqueue and statement counts.")
    args = p.parse_args()
    with c.scratch_database(NAME, args):
        c.header(f"workflows: fan-in of {args.nodes} nodes, {args.workers} worker(s)", args)
        enqueue = measure_enqueue(args)
        statements = measure_statements(args)
        drain = [] if args.skip_drain else measure_drain(args)
        c.write_results(NAME, args, {"enqueue": enqueue, "statements": statements, "drain": drain})
    return 0


def reset() -> None:
    from django.db import connection, transaction

    with transaction.atomic(), connection.cursor() as cur:
        for table in ("distsched_app_workflowedge", "distsched_app_workflownode"):
            cur.execute(f"DELETE FROM {table}")
    c.reset_tables()
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("DELETE FROM distsched_app_workflow")


def fan_in(n: int, name: str = "fan-in") -> dict:
    nodes = [{"id": f"u{i}", "task": "tests.noop"} for i in range(n)]
    return {"name": name, "nodes": [*nodes, {"id": "join", "task": "tests.noop", "after": [f"u{i}" for i in range(n)]}]}


def plain(n: int) -> None:
    from distsched_app.services.enqueue import Job, enqueue_many

    enqueue_many([Job(task_name="tests.noop") for _ in range(n)], now=c.now())


def measure_enqueue(args) -> dict:
    from distsched_app import workflows

    rows, wf_times, plain_times = [], [], []
    for rep in range(args.repeat):
        reset()
        spec = fan_in(args.nodes)
        start = time.perf_counter()
        workflows.enqueue(spec)
        wf_times.append(time.perf_counter() - start)
        reset()
        start = time.perf_counter()
        plain(args.nodes + 1)
        plain_times.append(time.perf_counter() - start)
        rows.append([rep + 1, args.nodes + 1, wf_times[-1], plain_times[-1]])
    print(c.table(["rep", "runs", "workflow enqueue s", "enqueue_many s"], rows))
    result = {"workflow_s": c.median(wf_times), "plain_s": c.median(plain_times)}
    goal = "meets" if result["workflow_s"] < 2 else "MISSES"
    print(f"median: workflow {result['workflow_s']:.3f} s ({goal} the 2 s goal), plain {result['plain_s']:.3f} s\n")
    return result


def _statements(run_id: int, worker: str) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from distsched_app.models import Run
    from distsched_app.services import outcomes

    run = Run.objects.get(pk=run_id)
    with CaptureQueriesContext(connection) as captured:
        success = outcomes.Success(run_id=run.pk, attempt=run.attempts, started_at=run.started_at, finished_at=c.now())
        outcomes.record_successes(worker_id=worker, successes=[success], now=c.now())
    return len(captured)


def measure_statements(args) -> dict:
    from distsched_app import workflows
    from distsched_app.models import Run, RunState
    from distsched_app.services import claiming

    reset()
    n = min(args.nodes, 2000)
    wf = workflows.enqueue(fan_in(n))
    ids = [wf.runs[f"u{i}"] for i in range(n)]
    now = c.now()
    # Every upstream but the first and the last succeeded by hand: the "late" finish sees them done.
    Run.objects.filter(pk__in=ids).update(state=RunState.RUNNING, lease_owner="bench", attempts=1, started_at=now)
    early = _statements(ids[0], "bench")
    from distsched_app.models import WorkflowEdge

    Run.objects.filter(pk__in=ids[1:-1]).update(state=RunState.SUCCEEDED, finished_at=now, lease_owner="")
    WorkflowEdge.objects.filter(upstream_id__in=ids[1:-1]).update(done=True)
    late = _statements(ids[-1], "bench")  # the last one: releases the join too
    reset()
    plain(1)
    [run] = claiming.claim_runs(worker_id="bench", queues=None, lease_seconds=60, now=c.now(), limit=1)
    alone = _statements(run.pk, "bench")
    print(
        c.table(
            ["finish", "statements"],
            [[f"upstream of a {n}-node fan-in, siblings waiting", early],
             [f"last upstream of a {n}-node fan-in (releases the join)", late],
             ["a run outside any workflow", alone]],
        )
    )  # fmt: skip
    print()
    return {"fan_in": n, "early": early, "late_releasing": late, "plain": alone}


def _drain(args, label: str, expected: int, rep: int) -> dict:
    from distsched_app.models import Run, RunState

    extra = shlex.split(args.worker_args)
    logs = [c.scratch_dir(NAME) / f"{label}-{rep}-{i}.log" for i in range(args.workers)]
    cpu_before = _children_cpu()
    start = time.perf_counter()
    procs = [
        c.spawn(
            c.worker_command(worker_id=f"{label}-{rep}-{i}", poll_interval=args.poll_interval, burst=True, extra=extra),
            log,
        )
        for i, log in enumerate(logs)
    ]
    c.wait_for(
        lambda: c.succeeded_count() >= expected or all(p.poll() is not None for p in procs),
        timeout=max(300.0, expected / 20),
    )
    wall = time.perf_counter() - start
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except Exception:  # noqa: BLE001 - reported below
            proc.kill()
    cpu = _children_cpu() - cpu_before  # the workers' own CPU (waited for above), start-up included
    done = Run.objects.filter(state=RunState.SUCCEEDED).count()
    if done < expected:
        print(f"{label} repetition {rep + 1}: {done}/{expected} succeeded", file=sys.stderr)
        for log in logs:
            print(f"--- {log.name}\n{c.tail(log)}", file=sys.stderr)
    first, last = event_window()
    window = (last - first).total_seconds() if first and last else float("nan")
    return {"leg": label, "rep": rep + 1, "runs": done, "wall_s": wall, "window_s": window,
            "window_runs_per_s": done / window if window else float("nan"),
            "worker_cpu_ms_per_run": 1000 * cpu / done if done else float("nan")}  # fmt: skip


def _children_cpu() -> float:
    """User + system CPU seconds of the child processes waited for so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def event_window():
    from django.db.models import Max, Min

    from distsched_app.models import EventType, RunEvent

    first = RunEvent.objects.filter(event_type=EventType.CLAIMED).aggregate(t=Min("created_at"))["t"]
    last = RunEvent.objects.filter(event_type=EventType.SUCCEEDED).aggregate(t=Max("created_at"))["t"]
    return first, last


def measure_drain(args) -> list[dict]:
    from distsched_app import workflows
    from distsched_app.models import Workflow

    legs = []
    expected = args.nodes + 1
    for rep in range(args.repeat):
        for label in ("workflow", "plain") if rep % 2 == 0 else ("plain", "workflow"):
            reset()
            if label == "workflow":
                workflows.enqueue(fan_in(args.nodes))
            else:
                plain(expected)
            c.analyze()
            legs.append(_drain(args, label, expected, rep))
            if label == "workflow":
                legs[-1]["workflow_state"] = Workflow.objects.get().state
    print(
        c.table(
            ["leg", "rep", "runs", "wall s", "window s", "window runs/s", "worker CPU ms/run"],
            [[r["leg"], r["rep"], r["runs"], r["wall_s"], r["window_s"], r["window_runs_per_s"],
              r["worker_cpu_ms_per_run"]] for r in legs],
        )
    )  # fmt: skip
    wf = c.median([r["window_runs_per_s"] for r in legs if r["leg"] == "workflow"])
    pl = c.median([r["window_runs_per_s"] for r in legs if r["leg"] == "plain"])
    ratio = wf / pl if pl else float("nan")
    print(f"median window: workflow {wf:.0f} runs/s, plain {pl:.0f} runs/s: {ratio:.0%} (goal >= 80%)")
    wf_cpu = c.median([r["worker_cpu_ms_per_run"] for r in legs if r["leg"] == "workflow"])
    pl_cpu = c.median([r["worker_cpu_ms_per_run"] for r in legs if r["leg"] == "plain"])
    print(
        f"median worker CPU: workflow {wf_cpu:.2f} ms/run, plain {pl_cpu:.2f} ms/run: "
        f"plain/workflow {pl_cpu / wf_cpu:.0%} (less sensitive to the machine's other load than the window)"
    )
    return legs


if __name__ == "__main__":
    sys.exit(main())
