"""A worker's steady state in this process: where each run's time goes, with no start-up in it.

    .venv/bin/python bench/steady.py --db sqlite --runs 10000 --split
    .venv/bin/python bench/steady.py --db postgres --runs 10000 --prefetch 128
    .venv/bin/python bench/steady.py --db postgres --split \
        --limits '{"never-binds": {"task": "tests.noop", "concurrency": 1000}}'

N no-op runs are enqueued one call each (as ``peers.py`` enqueues them), then one
``Worker`` drains them with ``run(burst=True)`` in this process. It prints the drain rate,
wall and CPU time per run (the worker's main thread, the whole process, and a local PostgreSQL
server's processes), and the garbage collector's passes. ``--split`` also prints the main
thread's CPU time per step of the hot path (claim, building the runs, the task call, recording
the outcomes) and per SQL
statement (through Django's execute wrapper), per run: where a change to the hot path should
show. The wrappers cost time themselves, so compare ``--split`` runs only with each other.
"""

from __future__ import annotations

import gc
import os
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import _common as c

NAME = "steady"


def _timed(owner: Any, name: str, label: str, spent: defaultdict[str, float], calls: Counter[str]) -> None:
    """Replace ``owner.name`` by a wrapper adding its main-thread CPU time to ``spent[label]``
    (and its wall time to ``spent["wall " + label]``: what the step waited for, the database mostly)."""
    inner = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started, wall = time.thread_time(), time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[label] += time.thread_time() - started
            spent["wall " + label] += time.perf_counter() - wall
            calls[label] += 1

    setattr(owner, name, wrapper)


def _split(spent: defaultdict[str, float], calls: Counter[str], statements: defaultdict[str, float]) -> None:
    from django.db import connection

    from distsched_app.conf import conf
    from distsched_app.db import claims as db_claims
    from distsched_app.services import claiming, events, limits, outcomes
    from distsched_app.worker import loop, recorder

    _timed(claiming, "claim_runs", "claiming.claim_runs", spent, calls)
    _timed(db_claims, "runs_from_rows", "claims.runs_from_rows", spent, calls)
    _timed(loop.Loop, "execute", "Loop.execute (the task call and its outcome)", spent, calls)
    _timed(recorder.Recorder, "flush", "Recorder.flush (successes written)", spent, calls)
    _timed(outcomes, "record_successes", "outcomes.record_successes", spent, calls)
    if conf.LIMITS:
        _timed(limits.Gate, "admit", "limits.Gate.admit", spent, calls)
        _timed(limits.Gate, "pick", "limits.Gate.pick (candidates, partitions locked)", spent, calls)
        _timed(limits.Gate, "finish", "limits.Gate.finish", spent, calls)
        _timed(limits, "release", "limits.release (holds deleted)", spent, calls)
        _timed(events, "record_many", "events.record_many (with the claim's writes)", spent, calls)

    def execute(run: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        started = time.thread_time()
        try:
            return run(sql, params, many, context)
        finally:
            statements[" ".join(sql.split())[:80]] += time.thread_time() - started
            calls[" ".join(sql.split())[:80]] += 1

    connection.execute_wrappers.append(execute)


def main() -> None:
    p = c.parser(__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10000)
    p.add_argument("--prefetch", type=int, help="The worker's prefetch (default: the worker's own).")
    p.add_argument("--split", action="store_true", help="Also the CPU time per step and per statement.")
    p.add_argument("--limits", default="", help="DISTSCHED['LIMITS'] as JSON (e.g. a limit that never binds).")
    args = p.parse_args()
    if args.limits:
        os.environ["DISTSCHED_TEST_LIMITS"] = args.limits  # read by tests/settings.py
    with c.scratch_database(NAME, args):
        from distsched_app.services.enqueue import Job, enqueue
        from distsched_app.worker import Worker

        limited = f", LIMITS {args.limits}" if args.limits else ""
        c.header(f"steady state, one in-process worker, {args.runs} no-op runs{limited}", args)
        for _ in range(args.runs):
            enqueue(Job(task_name=c.TASK), now=c.now())
        c.analyze()
        spent: defaultdict[str, float] = defaultdict(float)
        calls: Counter[str] = Counter()
        statements: defaultdict[str, float] = defaultdict(float)
        if args.split:
            _split(spent, calls, statements)
        passes: Counter[int] = Counter()
        gc_time: defaultdict[int, float] = defaultdict(float)
        gc_started = [0.0]

        def on_gc(phase: str, info: dict[str, int]) -> None:
            if phase == "start":
                gc_started[0] = time.perf_counter()
            else:
                passes[info["generation"]] += 1
                gc_time[info["generation"]] += time.perf_counter() - gc_started[0]

        gc.callbacks.append(on_gc)
        worker = Worker(
            worker_id="steady", poll_interval=0.05, **({"prefetch": args.prefetch} if args.prefetch else {})
        )
        server = c.server_cpu_seconds()
        wall, thread, process = time.perf_counter(), time.thread_time(), time.process_time()
        done = worker.run(burst=True, install_signals=False)
        wall, thread = time.perf_counter() - wall, time.thread_time() - thread
        process = time.process_time() - process
        server_after = c.server_cpu_seconds()
        gc.callbacks.remove(on_gc)
        if done != args.runs:
            raise SystemExit(f"the worker ran {done} runs, not {args.runs}")
        per = 1e6 / done
        print(f"{done} runs in {wall:.3f} s: {done / wall:,.0f} runs/s")
        print(
            f"per run: {wall * per:.1f} µs wall, {thread * per:.1f} µs main-thread CPU, "
            f"{process * per:.1f} µs process CPU"
            + (
                f", {(server_after - server) * per:.1f} µs server CPU"
                if server is not None and server_after is not None
                else ""
            )
        )
        print(
            "gc passes (generation: count, ms): "
            + ", ".join(f"{g}: {passes[g]}, {gc_time[g] * 1e3:.1f}" for g in sorted(passes))
        )
        if args.split:
            rows = [
                (label, calls[label], f"{v * per:.1f}", f"{spent['wall ' + label] * per:.1f}")
                for label, v in sorted(spent.items(), key=lambda kv: -kv[1])
                if not label.startswith("wall ")
            ]
            print(c.table(["step", "calls", "µs/run main-thread CPU", "µs/run wall"], rows))
            top = sorted(statements.items(), key=lambda kv: -kv[1])[:10]
            print(c.table(["statement", "calls", "µs/run"], [(s, calls[s], f"{v * per:.1f}") for s, v in top]))
        print("load " + ", ".join(f"{x:.1f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
