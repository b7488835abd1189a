"""A thousand live workers against one PostgreSQL: what their heartbeats, lease renewals and idle claims cost.

    .venv/bin/python bench/thousand_workers.py --db postgres                       # 1,000 workers, 4 simulators
    .venv/bin/python bench/thousand_workers.py --db postgres --workers 200 --runs 1000 --seconds 10  # quick pass

First version (issue 21 item 4): it measures; the tuning (batching, jitter) is still to do.

Simulated workers (``--workers``, 1,000) live in ``--simulators`` child processes of this script
(``--simulate I``), each doing what a real worker's threads do, through the same service calls:

- every ``HEARTBEAT_SECONDS`` (5 s, each worker at its own phase): ``workers.heartbeat`` and, for the
  ``--running`` workers (default half: one running run each, claimed at set-up), ``outcomes.renew_leases``
  of that run: two transactions;
- every ``POLL_INTERVAL`` (1 s) for the others (idle): one ``claiming.claim_runs`` on a queue
  holding nothing (``idle``): the idle claim, lease recovery included.

Then, side by side in one run: ``--real-workers`` (4) real ``runworker --burst`` processes drain
``--runs`` (2,000) no-op runs on ``default`` without the simulated crowd, and again with it.
Reported per phase: the real workers' runs/s, the database's transactions/s (``pg_stat_database``
xact_commit + xact_rollback deltas) and its CPU (utime + stime of every ``postgres`` process, from
``/proc``, as a share of one core), and how far behind its schedule each simulator fell (a
simulator that cannot keep up under-reports the cost: its lag says so).
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import _common as c

NAME = "thousand_workers"
IDLE_QUEUE = "idle"


def main() -> int:
    p = c.parser(__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=1000, help="Simulated live workers.")
    p.add_argument("--running", type=int, default=None, help="Of them, how many hold a running run (default half).")
    p.add_argument("--simulators", type=int, default=4, help="Child processes sharing the simulated workers.")
    p.add_argument("--real-workers", type=int, default=4, help="Real runworker --burst processes draining runs.")
    p.add_argument("--runs", type=int, default=2000, help="No-op runs drained per phase.")
    p.add_argument("--seconds", type=float, default=20.0, help="Idle measuring window with the crowd alive.")
    p.add_argument("--heartbeat", type=float, default=5.0, help="HEARTBEAT_SECONDS of the simulated workers.")
    p.add_argument("--poll", type=float, default=1.0, help="POLL_INTERVAL of the idle simulated workers.")
    p.add_argument("--simulate", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.simulate is not None:
        return simulate(args)
    if args.db != "postgres":
        raise SystemExit("thousand_workers measures PostgreSQL (--db postgres)")
    args.running = args.workers // 2 if args.running is None else min(args.running, args.workers)
    with c.scratch_database(NAME, args):
        c.header(f"thousand workers: {args.workers} simulated ({args.running} running), {args.real_workers} real", args)
        return measure(args)


# -- the parent ----------------------------------------------------------------------------------


def measure(args: argparse.Namespace) -> int:
    set_up_crowd(args)
    rows = [drain_phase(args, "without the crowd", crowd=None)]
    crowd = start_crowd(args)
    try:
        time.sleep(min(10.0, args.heartbeat * 2))  # every simulated worker through its first beats
        idle = window(args.seconds)
        rows.append(drain_phase(args, "with the crowd", crowd=crowd))
    finally:
        lags = stop_crowd(crowd)
    print(
        c.table(
            ["phase", "real workers runs/s", "db transactions/s", "db CPU (cores)"],
            [[r["phase"], r["runs_per_s"], r["tps"], r["cpu"]] for r in rows]
            + [["crowd alone (idle window)", "-", idle["tps"], idle["cpu"]]],
        )
    )
    print(f"simulators' worst lag behind schedule: {max(lags, default=float('nan')):.2f} s")
    c.write_results(NAME, args, {"phases": rows, "crowd_idle": idle, "simulator_lag_s": lags})
    return 0


def set_up_crowd(args: argparse.Namespace) -> None:
    """Register the simulated workers; give each running one a run it holds (claimed on ``idle``)."""
    from distsched_app.models import Run
    from distsched_app.services import claiming, workers
    from distsched_app.services.enqueue import Job, enqueue

    now = c.now()
    for i in range(args.workers):
        workers.register_worker(worker_id=sim_id(i), hostname=socket.gethostname(), pid=0, queues=[], now=now)
    for _ in range(args.running):
        enqueue(Job(task_name=c.TASK, queue=IDLE_QUEUE), now=now)
    for i in range(args.running):
        claimed = claiming.claim_runs(
            worker_id=sim_id(i), queues=[IDLE_QUEUE], lease_seconds=3600, now=now, limit=1, start_all=True
        )
        if len(claimed) != 1:
            raise SystemExit(f"set-up: simulated worker {i} claimed {len(claimed)} runs")
    if Run.objects.filter(queue=IDLE_QUEUE, state="running").count() != args.running:
        raise SystemExit("set-up: the simulated workers' runs are not all running")
    c.analyze()


def drain_phase(args: argparse.Namespace, phase: str, crowd: list[subprocess.Popen] | None) -> dict[str, object]:
    from distsched_app.models import Run

    Run.objects.filter(queue="default").delete()
    c.seed_due_runs(args.runs, prefix=f"d{len(phase)}{random.randrange(10**6)}")
    c.analyze()
    before = stats()
    start = time.perf_counter()
    procs = [
        c.spawn(
            c.worker_command(worker_id=f"real-{phase[:4]}-{i}", poll_interval=0.05, burst=True, extra=[]),
            c.scratch_dir(NAME) / f"real-{i}.log",
        )
        for i in range(args.real_workers)
    ]
    done = lambda: Run.objects.filter(queue="default", state="succeeded").count()  # noqa: E731
    c.wait_for(lambda: done() >= args.runs or all(p.poll() is not None for p in procs), timeout=600, interval=0.1)
    wall = time.perf_counter() - start
    after = stats()
    for proc in procs:
        proc.wait(timeout=60)
    return {"phase": phase, "runs_per_s": done() / wall, **rates(before, after)}


def start_crowd(args: argparse.Namespace) -> list[subprocess.Popen]:
    script = Path(__file__).resolve()
    flags = ["--db", "postgres", "--workers", str(args.workers), "--running", str(args.running)]
    flags += ["--simulators", str(args.simulators), "--heartbeat", str(args.heartbeat), "--poll", str(args.poll)]
    return [
        subprocess.Popen(
            [sys.executable, str(script), *flags, "--simulate", str(i)],
            env=dict(os.environ),
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(args.simulators)
    ]


def stop_crowd(crowd: list[subprocess.Popen]) -> list[float]:
    lags = []
    for proc in crowd:
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
        for line in out.splitlines():
            if line.startswith("lag "):
                lags.append(float(line.split()[1]))
    return lags


def window(seconds: float) -> dict[str, float]:
    before = stats()
    time.sleep(seconds)
    return rates(before, stats())


def stats() -> tuple[float, int, float]:
    """(monotonic time, the database's transactions so far, CPU seconds of every postgres process)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()")
        (xacts,) = cursor.fetchone()
    return time.monotonic(), int(xacts), postgres_cpu_seconds()


def rates(before: tuple[float, int, float], after: tuple[float, int, float]) -> dict[str, float]:
    seconds = after[0] - before[0]
    return {"tps": (after[1] - before[1]) / seconds, "cpu": (after[2] - before[2]) / seconds}


def postgres_cpu_seconds() -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        if name.startswith("postgres"):
            fields = stat[stat.rindex(")") + 2 :].split()
            # utime, stime, and the reaped children's (the postmaster's: backends that exited)
            total += sum(int(f) for f in fields[11:15])
    return total / tick


def sim_id(i: int) -> str:
    return f"sim-{i:05d}"


# -- a simulator child ---------------------------------------------------------------------------


def simulate(args: argparse.Namespace) -> int:
    """Serve simulated workers ``i % simulators == simulate`` until SIGTERM; print the worst lag."""
    import signal

    import django

    django.setup()
    from distsched_app.models import Run
    from distsched_app.services import claiming, outcomes, workers

    mine = [i for i in range(args.workers) if i % args.simulators == args.simulate]
    held = dict(
        Run.objects.filter(lease_owner__in=[sim_id(i) for i in mine], queue=IDLE_QUEUE).values_list("lease_owner", "pk")
    )
    attempts = dict(Run.objects.filter(pk__in=list(held.values())).values_list("pk", "attempts"))
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    start = time.monotonic()
    rng = random.Random(args.simulate)
    # (next due monotonic time, worker index, what): heartbeats for everyone, idle claims for the idle.
    due: list[tuple[float, int, str]] = []
    for i in mine:
        due.append((start + rng.uniform(0, args.heartbeat), i, "beat"))
        if sim_id(i) not in held:
            due.append((start + rng.uniform(0, args.poll), i, "claim"))
    worst = 0.0
    heapq.heapify(due)
    while not stopping:
        when, i, what = heapq.heappop(due)
        wait = when - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        worst = max(worst, time.monotonic() - when)
        now = c.now()
        worker_id = sim_id(i)
        if what == "beat":
            workers.heartbeat(worker_id=worker_id, now=now, current_run_id=held.get(worker_id))
            if worker_id in held:
                run_id = held[worker_id]
                outcomes.renew_leases(worker_id=worker_id, held={run_id: attempts[run_id]}, now=now, lease_seconds=3600)
            heapq.heappush(due, (when + args.heartbeat, i, what))
        else:
            claiming.claim_runs(worker_id=worker_id, queues=[IDLE_QUEUE], lease_seconds=30, now=now, limit=1)
            heapq.heappush(due, (when + args.poll, i, what))
    print(f"lag {worst:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
