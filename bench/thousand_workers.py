"""A thousand live workers against one PostgreSQL: what their heartbeats, lease renewals and idle claims cost.

    .venv/bin/python bench/thousand_workers.py --db postgres                    # 1,000 workers, 1,000 runs held
    .venv/bin/python bench/thousand_workers.py --db postgres --no-listen        # idle workers poll (no LISTEN)
    .venv/bin/python bench/thousand_workers.py --db postgres --workers 200 --seconds 10 --repeat 1  # quick pass

The simulated workers replay **the product's own statements**: at set-up, for every simulated
worker, a real ``distsched_app.worker.Worker`` (its id, its held runs) runs each of its periodic
operations once through the product's code, under a recorder (``connection.execute_wrapper``) that
keeps every statement as Django's psycopg cursor sends it (client-side binding: the text with its
values in) and the transaction boundaries. The simulators then issue those statements, one round
trip each, at the product's pace, with the values recorded (timestamps included: they touch only
the simulated workers' own rows and runs, and the plans are the same):

- ``beat`` (every worker): ``Heartbeat.beat``, every ``HEARTBEAT_SECONDS`` (shortened by
  ``HEARTBEAT_JITTER`` where the product has it), the clock-skew query once a minute where the product
  measures it apart (``skew``);
- ``idle claim`` (idle workers): ``Loop.claim`` with lease recovery, then ``claiming.next_due``: every
  ``POLL_INTERVAL``, backing off to ``IDLE_POLL_MAX_SECONDS`` where the product does so while a
  listener wakes the worker (``--no-listen``: a fleet behind a pooler with no LISTEN connection);
- ``chores`` (idle workers): ``Loop.maybe_sweep`` and ``Loop.maybe_bulk`` every 5 s, or at the
  backed-off idle poll's pace where the product does so.

A simulator is a process (``--simulators``) with an asyncio loop driving ``--connections`` psycopg 3
connections (client-side binding, as Django's backend), like a pooler in transaction mode would:
1,000 workers' own connections do not fit a stock PostgreSQL (``max_connections`` 100). Each
simulator reports the operations that came due and those done, so the table says whether the
nominal load was reached (and the lag behind schedule).

Side by side in one run, ``--repeat`` times alternately: ``--real-workers`` (4) real ``runworker
--burst`` processes drain ``--runs`` no-op runs without the simulated fleet and with it (claim
throughput: runs/s between the first start and the last finish). Reported: the database's
transactions/s (``pg_stat_database`` xact_commit + xact_rollback deltas), the CPU of the
benchmark database's backends (from ``/proc``; as a share of one core) and of every PostgreSQL
process on the machine, the fleet alone over a ``--seconds`` window, and the ratio of claim
throughputs. To measure another version of the product, run this file from a copy of that
version's tree (``git archive``): the product code comes from the tree the script sits in.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import os
import pickle
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import _common as c

NAME = "thousand_workers"
IDLE_QUEUE = "idle"  # the simulated workers' queue: their runs, and idle claims that find nothing
CHORE_SECONDS = 5.0  # Loop.maybe_sweep (limits.SWEEP_SECONDS) and Loop.maybe_bulk (BULK_IDLE_SECONDS)
SKEW_SECONDS = 60.0  # where the product measures the skew apart from the beat (heartbeat.SKEW_CHECK_SECONDS)


def main() -> int:
    p = c.parser(__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=1000, help="Simulated live workers.")
    p.add_argument("--held", type=int, default=1000, help="Running runs held by the busy simulated workers.")
    p.add_argument("--busy", type=int, default=None, help="Busy simulated workers (default half); the rest idle.")
    p.add_argument("--simulators", type=int, default=3, help="Simulator processes.")
    p.add_argument("--connections", type=int, default=6, help="Database connections per simulator.")
    p.add_argument("--real-workers", type=int, default=4, help="Real runworker --burst processes draining runs.")
    p.add_argument("--runs", type=int, default=5000, help="No-op runs drained per phase.")
    p.add_argument("--seconds", type=float, default=20.0, help="Window measuring the fleet alone.")
    p.add_argument("--warmup", type=float, default=20.0, help="Fleet running before measuring (backoff settles).")
    p.add_argument("--repeat", type=int, default=3, help="Drain pairs (without, with the fleet); medians.")
    p.add_argument("--no-listen", action="store_true", help="Idle workers poll: no listener wakes them.")
    p.add_argument("--no-control", action="store_true", help="Skip the CPU control leg.")
    p.add_argument("--simulate", type=str, default=None, help=argparse.SUPPRESS)
    p.add_argument("--burn", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.simulate is not None:
        return asyncio.run(simulate(args.simulate))
    if args.burn is not None:
        return burn(args.burn)
    if args.db != "postgres":
        raise SystemExit("thousand_workers measures PostgreSQL (--db postgres)")
    args.busy = args.workers // 2 if args.busy is None else min(args.busy, args.workers)
    with c.scratch_database(NAME, args):
        title = f"thousand workers: {args.workers} simulated ({args.busy} busy holding {args.held} runs)"
        c.header(f"{title}, {args.real_workers} real", args)
        return measure(args)


# -- the parent ----------------------------------------------------------------------------------


def measure(args: argparse.Namespace) -> int:
    plans = set_up_fleet(args)
    sampler = CpuSampler()
    drains: dict[str, list[dict[str, float]]] = {"without": [], "with": [], "control": []}
    fleet: list[Simulator] = []
    try:
        for _ in range(args.repeat):
            drains["without"].append(drain(args, sampler, "without"))
            if not fleet:
                fleet = start_fleet(args, plans)
                time.sleep(args.warmup)
                alone = fleet_window(args, sampler, fleet)
            else:
                resume(fleet)
            drains["with"].append(drain(args, sampler, "with"))
            pause(fleet)
            if not args.no_control:  # the same CPU as the fleet, no database: what CPU sharing alone costs
                drains["control"].append(drain(args, sampler, "control", burn_cores=control_share(alone)))
    finally:
        stop_fleet(fleet)
        sampler.stop()
    report(args, drains, alone)
    return 0


def sim_id(i: int) -> str:
    return f"sim-{i:05d}"


def set_up_fleet(args: argparse.Namespace) -> list[list[dict[str, Any]]]:
    """Register the simulated workers, give the busy ones their running runs, and record, per
    worker, the statements of each periodic operation (``plan_for``); split by simulator."""
    from distsched_app.services import claiming
    from distsched_app.services.enqueue import Job, enqueue

    try:  # a ticker leads, as wherever `tick --loop` runs: workers leave the sweeps to it
        from distsched_app.db import leader
        from distsched_app.services.leader import ROLE

        leader.create(ROLE, holder="bench-ticker", pid=0, host="bench", lease_seconds=86400)
    except ImportError:  # a product without leader election: every worker sweeps
        pass
    now = c.now()
    for _ in range(args.held):
        enqueue(Job(task_name=c.TASK, queue=IDLE_QUEUE), now=now)
    per_busy = [args.held // args.busy + (1 if i < args.held % args.busy else 0) for i in range(args.busy)]
    plans: list[list[dict[str, Any]]] = [[] for _ in range(args.simulators)]
    for i in range(args.workers):
        worker = product_worker(i, concurrency=max(1, per_busy[i]) if i < args.busy else 1)
        worker.register()
        runs = []
        if i < args.busy:
            runs = claiming.claim_runs(
                worker_id=worker.worker_id,
                queues=[IDLE_QUEUE],
                lease_seconds=worker.lease_seconds,
                now=c.now(),
                limit=per_busy[i],
                start_all=True,
            )
            if len(runs) != per_busy[i]:
                raise SystemExit(f"set-up: simulated worker {i} claimed {len(runs)} runs")
            for attempt in worker.held.hold(runs):
                worker.held.start(attempt.run_id)
        plans[i % args.simulators].append(plan_for(worker, busy=bool(runs), listening=not args.no_listen))
    c.analyze()
    shapes: dict[str, list[tuple[int, int]]] = {}
    for plan in plans:
        for worker_plan in plan:
            for op in worker_plan["ops"]:
                statements, transactions = shape(op["items"])
                shapes.setdefault(op["kind"], []).append((statements, transactions))
                NOMINAL_XACTS[op["kind"]] = NOMINAL_XACTS.get(op["kind"], 0.0) + transactions / steady_period(op)
    for kind, rows in shapes.items():  # the mean over the workers (a busy worker's beat renews leases)
        SHAPES[kind] = (statistics.mean(r[0] for r in rows), statistics.mean(r[1] for r in rows))
    return plans


SHAPES: dict[str, tuple[float, float]] = {}  # kind -> (statements, transactions) of one operation, mean
NOMINAL_XACTS: dict[str, float] = {}  # kind -> transactions/s of the fleet at its steady pace


def steady_period(op: dict[str, Any]) -> float:
    """The mean interval of an operation once an idle backoff has reached its ceiling."""
    return float(op.get("ceiling", op["every"])) * (1 - op["jitter"] / 2)


def product_worker(i: int, *, concurrency: int) -> Any:
    from distsched_app.worker import Worker

    return Worker(worker_id=sim_id(i), queues=[IDLE_QUEUE], concurrency=concurrency)


def plan_for(worker: Any, *, busy: bool, listening: bool) -> dict[str, Any]:
    """What one simulated worker does: per operation, its recorded statements and its pace."""
    from distsched_app.db import server
    from distsched_app.services import claiming

    heartbeat = worker.heartbeat_thread
    apart = hasattr(heartbeat, "interval")  # this product measures the skew apart from the beat
    if apart:
        heartbeat._next_skew_check = float("inf")
    jitter = float(getattr(worker, "heartbeat_jitter", 0.0))
    ops = [{"kind": "beat", "items": record(heartbeat.beat), "every": worker.heartbeat_seconds, "jitter": jitter}]
    if apart:
        ops.append({"kind": "skew", "items": record(server.clock_timestamp), "every": SKEW_SECONDS, "jitter": 0.0})
    if not busy:
        loop = worker.loop

        def idle_claim() -> None:
            loop.claim(1, force_expired=True)
            claiming.next_due(queues=worker.queues, capabilities=worker.capabilities, skip_tasks=worker.guard.skipped())

        def chores() -> None:
            loop._next_sweep = loop._next_bulk = 0.0
            loop.maybe_sweep()
            loop.maybe_bulk()

        idle = getattr(loop, "idle", None)  # the product's idle backoff, if it has one
        ceiling = idle.ceiling if idle is not None and listening else worker.poll_interval
        ops.append(
            {
                "kind": "idle claim",
                "items": record(idle_claim),
                "every": worker.poll_interval,
                "ceiling": ceiling,
                "jitter": idle.jitter if idle is not None and listening else 0.0,
            }
        )
        # Where the product backs off, its chores follow the idle poll (Loop.maybe_sweep/maybe_bulk).
        every = max(CHORE_SECONDS, ceiling) if idle is not None else CHORE_SECONDS
        ops.append({"kind": "chores", "items": record(chores), "every": every, "jitter": 0.0})
    return {"worker": worker.worker_id, "ops": ops}


def record(fn: Any) -> list[tuple]:
    """Run ``fn`` through the product once; every statement it issued (SQL, parameters, whether
    inside a transaction) and every COMMIT, in order."""
    from django.db import connection

    items: list[tuple] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        # As Django's psycopg cursor (client-side binding) sends it: the text with its values in.
        with connection.connection.cursor() as cursor:
            text = cursor.mogrify(sql, params) if params is not None else sql
        items.append(("q", text, connection.in_atomic_block))
        return execute(sql, params, many, context)

    real_commit = connection.commit

    def commit() -> None:
        items.append(("commit",))
        real_commit()

    connection.commit = commit  # type: ignore[method-assign]
    try:
        with connection.execute_wrapper(wrapper):
            fn()
    finally:
        del connection.commit
    return items


class Simulator:
    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.latest: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.latest = json.loads(line)


def start_fleet(args: argparse.Namespace, plans: list[list[dict[str, Any]]]) -> list[Simulator]:
    folder = c.scratch_dir(NAME)
    fleet = []
    for i, plan in enumerate(plans):
        path = folder / f"plan-{i}.pickle"
        path.write_bytes(pickle.dumps({"plan": plan, "connections": args.connections, "seed": i}))
        flags = ["--db", "postgres", "--simulate", str(path)]
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), *flags],
            env=dict(os.environ),
            stdout=subprocess.PIPE,
            text=True,
        )
        fleet.append(Simulator(proc))
    c.wait_for(lambda: all(s.latest for s in fleet), timeout=120, interval=0.2)
    return fleet


def pause(fleet: list[Simulator]) -> None:
    for s in fleet:
        s.proc.send_signal(signal.SIGUSR1)


def resume(fleet: list[Simulator]) -> None:
    for s in fleet:
        s.proc.send_signal(signal.SIGUSR2)
    time.sleep(CHORE_SECONDS)  # back to its pace (its schedule restarts where it paused)


def stop_fleet(fleet: list[Simulator]) -> None:
    for s in fleet:
        s.proc.terminate()
    for s in fleet:
        s.proc.wait(timeout=60)


def fleet_counters(fleet: list[Simulator]) -> dict[str, dict[str, float]]:
    total: dict[str, dict[str, float]] = {}
    for s in fleet:
        for kind, row in s.latest.get("ops", {}).items():
            mine = total.setdefault(kind, {"due": 0, "done": 0, "nominal": 0.0, "lag_max": 0.0})
            mine["due"] += row["due"]
            mine["done"] += row["done"]
            mine["nominal"] += row["nominal"]
            mine["lag_max"] = max(mine["lag_max"], row["lag_max"])
    return total


def shape(items: list[tuple]) -> tuple[int, int]:
    """(statements, transactions) of one recorded operation."""
    statements = sum(1 for item in items if item[0] == "q")
    commits = sum(1 for item in items if item[0] == "commit")
    return statements, commits + sum(1 for item in items if item[0] == "q" and not item[2])


def process_cpu(pids: list[int]) -> float:
    """CPU seconds (user + system) of these processes."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def fleet_window(args: argparse.Namespace, sampler: CpuSampler, fleet: list[Simulator]) -> dict[str, Any]:
    pids = [s.proc.pid for s in fleet]
    ops_before, before, sim_before = fleet_counters(fleet), sampler.snapshot(), process_cpu(pids)
    time.sleep(args.seconds)
    ops_after, after, sim_after = fleet_counters(fleet), sampler.snapshot(), process_cpu(pids)
    seconds = after["t"] - before["t"]
    ops = {
        kind: {
            "nominal_per_s": ops_after[kind]["nominal"],
            "due_per_s": (ops_after[kind]["due"] - ops_before[kind]["due"]) / seconds,
            "done_per_s": (ops_after[kind]["done"] - ops_before[kind]["done"]) / seconds,
            "lag_max_s": ops_after[kind]["lag_max"],
            "statements_per_op": SHAPES[kind][0],
            "transactions_per_op": SHAPES[kind][1],
        }
        for kind in ops_after
    }
    simulators = (sim_after - sim_before) / (after["t"] - before["t"])
    return {**rates(before, after), "ops": ops, "cpu_simulators": simulators}


def control_share(alone: dict[str, Any]) -> float:
    """The CPU (in cores) the fleet took on this machine: its simulators and its database backends."""
    return float(alone["cpu_simulators"] + alone["cpu_ours"])


def burn(cores: float) -> int:
    """A ``--burn`` child: burn ``cores`` of one core (at most 1) of CPU time, touching no database,
    until terminated. It keeps a debt (its CPU time against ``cores`` x the wall time since it
    started) and spins in 1 ms slices while in debt, else sleeps 1 ms: time lost while descheduled
    is made up, as the fleet's operations that came due are done late rather than dropped."""
    share = min(1.0, max(0.0, cores))
    wall0, cpu0 = time.monotonic(), time.process_time()
    while True:
        if time.process_time() - cpu0 < share * (time.monotonic() - wall0):
            until = time.process_time() + 0.001
            while time.process_time() < until:
                pass
        else:
            time.sleep(0.001)


def start_burners(cores: float) -> list[subprocess.Popen]:
    """``--burn`` children to burn ``cores`` between them, one per tenth of a core started: the
    fleet's CPU is spread over dozens of processes (its backends, the simulators), and the kernel
    shares a core per process, so one busy process beside the real workers gets far less than
    its target (0.18 of 0.44 cores measured)."""
    count = max(1, int(-(-cores // 0.1)))
    return [
        subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--db", "postgres", "--burn", f"{share}"])
        for share in [cores / count] * count
    ]


def drain(args: argparse.Namespace, sampler: CpuSampler, phase: str, *, burn_cores: float = 0.0) -> dict[str, float]:
    """``--real-workers`` real workers drain ``--runs`` no-op runs of ``default`` (beside
    ``burn_cores`` of busy-looping processes, for the control leg)."""
    from django.db.models import Max, Min

    from distsched_app.models import Run

    Run.objects.filter(queue="default").delete()
    c.seed_due_runs(args.runs, prefix=f"{phase}{random.randrange(10**9)}")
    c.analyze()
    burners = start_burners(burn_cores) if burn_cores > 0 else []
    time.sleep(1.0 if burners else 0.0)  # their interpreters started: they burn from here
    before, burnt_before = sampler.snapshot(), process_cpu([b.pid for b in burners])
    procs = [
        c.spawn(
            c.worker_command(worker_id=f"real-{phase}-{i}", poll_interval=0.05, burst=True, extra=[]),
            c.scratch_dir(NAME) / f"real-{i}.log",
        )
        for i in range(args.real_workers)
    ]
    done = lambda: Run.objects.filter(queue="default", state="succeeded").count()  # noqa: E731
    c.wait_for(lambda: done() >= args.runs or all(p.poll() is not None for p in procs), timeout=900, interval=0.2)
    for proc in procs:
        proc.wait(timeout=60)
    burnt = process_cpu([b.pid for b in burners]) - burnt_before
    for b in burners:
        b.terminate()
    for b in burners:
        b.wait(timeout=30)
    time.sleep(1.2)  # backends report their statistics at most once a second (and at exit)
    after = sampler.snapshot()
    span = Run.objects.filter(queue="default", state="succeeded").aggregate(a=Min("started_at"), b=Max("finished_at"))
    seconds = (span["b"] - span["a"]).total_seconds()
    burn_seconds = after["t"] - before["t"] - 1.2
    return {
        "runs_per_s": done() / seconds,
        **rates(before, after),
        "burn_target": burn_cores,
        "burnt_cores": burnt / burn_seconds if burners else 0.0,
    }


# -- what the database did ------------------------------------------------------------------------


class CpuSampler:
    """CPU seconds of the benchmark database's backends (their process title names the database)
    and of every PostgreSQL process, sampled every 0.2 s so that a backend that exits between two
    snapshots (a real worker's) still counts up to its last sample."""

    def __init__(self) -> None:
        from django.db import connection

        self.database = connection.settings_dict["NAME"]
        self.tick = os.sysconf("SC_CLK_TCK")
        self.ours: dict[int, float] = {}
        self.everyone: dict[int, float] = {}
        self.gone_ours = self.gone_all = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self._sample()

    def _sample(self) -> None:
        ours: dict[int, float] = {}
        everyone: dict[int, float] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                if "(postgres" not in stat:
                    continue
                title = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            cpu = (int(fields[11]) + int(fields[12])) / self.tick
            everyone[int(entry.name)] = cpu
            if f" {self.database} " in title:
                ours[int(entry.name)] = cpu
        with self._lock:  # a process gone since the last sample: its CPU up to that sample stays counted
            self.gone_ours += sum(cpu for pid, cpu in self.ours.items() if pid not in ours)
            self.gone_all += sum(cpu for pid, cpu in self.everyone.items() if pid not in everyone)
            self.ours, self.everyone = ours, everyone

    def snapshot(self) -> dict[str, float]:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
            )
            (xacts,) = cursor.fetchone()
        self._sample()
        with self._lock:
            ours = self.gone_ours + sum(self.ours.values())
            everyone = self.gone_all + sum(self.everyone.values())
        return {"t": time.monotonic(), "xacts": int(xacts), "ours": ours, "all": everyone}

    def stop(self) -> None:
        self._stop.set()


def rates(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    seconds = after["t"] - before["t"]
    return {
        "tps": (after["xacts"] - before["xacts"]) / seconds,
        "cpu_ours": (after["ours"] - before["ours"]) / seconds,
        "cpu_all": (after["all"] - before["all"]) / seconds,
    }


def done_enough(o: dict[str, float]) -> bool:
    """The simulators kept up: what came due was done, and the pace came due as planned."""
    return o["done_per_s"] >= 0.95 * o["due_per_s"] and o["due_per_s"] >= 0.9 * o["nominal_per_s"]


def report(args: argparse.Namespace, drains: dict[str, list[dict[str, float]]], alone: dict[str, Any]) -> None:
    ops = alone["ops"]
    print(
        c.table(
            ["operation", "stmts", "xacts", "nominal/s", "came due/s", "done/s", "reached", "worst lag (s)"],
            [
                [
                    kind,
                    o["statements_per_op"],
                    o["transactions_per_op"],
                    o["nominal_per_s"],
                    o["due_per_s"],
                    o["done_per_s"],
                    "yes" if done_enough(o) else "NO",
                    o["lag_max_s"],
                ]
                for kind, o in ops.items()
            ]
            + [
                [
                    "total",
                    "",
                    "",
                    sum(o["nominal_per_s"] for o in ops.values()),
                    sum(o["due_per_s"] for o in ops.values()),
                    sum(o["done_per_s"] for o in ops.values()),
                    "",
                    "",
                ]
            ],
        )
    )
    nominal_xacts = sum(NOMINAL_XACTS.values())
    print(f"nominal transactions/s of the fleet at its steady pace: {nominal_xacts:,.0f}")
    reached = all(done_enough(o) for o in ops.values())
    if not reached:
        print("the simulators did NOT reach the nominal load: the fleet's cost below is under-reported")

    def median(phase: str, key: str) -> float:
        return statistics.median(r[key] for r in drains[phase])

    phases = ("without", "control", "with") if drains["control"] else ("without", "with")
    names = {
        "without": "drain, nothing beside",
        "control": "drain, CPU control beside",
        "with": "drain, the fleet beside",
    }
    rows = [
        [names[phase], median(phase, "runs_per_s"), median(phase, "tps"),
         median(phase, "cpu_ours"), median(phase, "cpu_all")]
        for phase in phases
    ] + [["the fleet alone", "-", alone["tps"], alone["cpu_ours"], alone["cpu_all"]]]  # fmt: skip
    print(f"the simulators' own CPU over the fleet window: {alone['cpu_simulators']:.2f} cores (a share of the "
          f"{os.cpu_count()} this machine's real workers and database also need)")  # fmt: skip
    print()
    print(c.table(["phase", "real workers runs/s", "db xacts/s", "db CPU ours (cores)", "all postgres (cores)"], rows))
    ratios = [w["runs_per_s"] / o["runs_per_s"] for o, w in zip(drains["without"], drains["with"], strict=True)]
    print(f"\nclaim throughput with the fleet / without: {statistics.median(ratios):.2f} (each pair: "
          f"{', '.join(f'{r:.2f}' for r in ratios)})")  # fmt: skip
    control: list[float] = []
    beyond: list[float] = []
    if drains["control"]:
        pairs = zip(drains["without"], drains["control"], drains["with"], strict=True)
        control = [k["runs_per_s"] / o["runs_per_s"] for o, k, _ in pairs]
        beyond = [w["runs_per_s"] / k["runs_per_s"] for k, w in zip(drains["control"], drains["with"], strict=True)]
        print(f"the CPU control: {control_share(alone):.2f} cores targeted (the simulators "
              f"{alone['cpu_simulators']:.2f} + the fleet's backends {alone['cpu_ours']:.2f}), "
              f"{median('control', 'burnt_cores'):.2f} burnt (median)")  # fmt: skip
        print(f"claim throughput with the CPU control / without: {statistics.median(control):.2f} (each: "
              f"{', '.join(f'{r:.2f}' for r in control)})")  # fmt: skip
        print(f"the fleet's cost beyond its CPU share, with the fleet / with the control: "
              f"{statistics.median(beyond):.2f} "
              f"(each: {', '.join(f'{r:.2f}' for r in beyond)})")  # fmt: skip
    c.write_results(
        NAME,
        args,
        {
            "drains": drains,
            "fleet_alone": alone,
            "ratios": ratios,
            "control_ratios": control,
            "beyond_cpu_ratios": beyond,
            "reached": reached,
            "nominal_xacts": NOMINAL_XACTS,
        },
    )


# -- a simulator child ---------------------------------------------------------------------------


async def simulate(plan_path: str) -> int:
    """Serve the simulated workers of ``plan_path`` until SIGTERM (SIGUSR1 pauses, SIGUSR2 resumes);
    print the counters as a JSON line every second."""
    import django
    import psycopg

    django.setup()
    from django.db import connection

    spec = pickle.loads(Path(plan_path).read_bytes())  # noqa: S301 - written by the parent, just now
    rng = random.Random(spec["seed"])
    settings = connection.settings_dict
    conns = [
        await psycopg.AsyncConnection.connect(
            host=settings["HOST"], port=settings["PORT"] or 5432, user=settings["USER"], dbname=settings["NAME"],
            password=settings["PASSWORD"] or None, autocommit=True, cursor_factory=psycopg.AsyncClientCursor,
            options="-c timezone=UTC",
        )
        for _ in range(spec["connections"])
    ]  # fmt: skip
    loop = asyncio.get_running_loop()
    stopping, paused = asyncio.Event(), asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    loop.add_signal_handler(signal.SIGUSR1, paused.set)
    loop.add_signal_handler(signal.SIGUSR2, paused.clear)
    counters: dict[str, dict[str, float]] = {}
    errors: list[str] = []
    heap: list[tuple[float, int, int, int]] = []  # (due, worker, op, backoff level)
    plan = spec["plan"]
    start = time.monotonic()
    for w, worker in enumerate(plan):
        for o, op in enumerate(worker["ops"]):
            row = counters.setdefault(op["kind"], {"due": 0, "done": 0, "nominal": 0.0, "lag_max": 0.0})
            row["nominal"] += 1 / steady_period(op)
            heap.append((start + rng.uniform(0, op["every"]), w, o, 0))
    heapq.heapify(heap)
    queue: asyncio.Queue[tuple[float, int, int]] = asyncio.Queue()

    def next_delay(op: dict[str, Any], level: int) -> float:
        if "ceiling" not in op:
            return op["every"] * (1 - op["jitter"] * rng.random())  # pacing.jittered
        current = min(op["ceiling"], op["every"] * 2**level)  # pacing.IdleBackoff, listening
        return max(op["every"], current * (1 - op["jitter"] * rng.random()))

    async def dispatch() -> None:
        while not stopping.is_set():
            if paused.is_set():
                while not queue.empty():  # a backlog (a simulator behind its pace) is dropped, not served
                    queue.get_nowait()
                pause_start = time.monotonic()
                while paused.is_set() and not stopping.is_set():
                    await asyncio.sleep(0.05)
                moved = time.monotonic() - pause_start  # the schedule resumes where it paused
                heap[:] = [(d + moved, w, o, lv) for d, w, o, lv in heap]
                heapq.heapify(heap)
                continue
            due, w, o, level = heap[0]
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(min(wait, 0.05))
                continue
            heapq.heappop(heap)
            op = plan[w]["ops"][o]
            counters[op["kind"]]["due"] += 1
            queue.put_nowait((due, w, o))
            heapq.heappush(heap, (due + next_delay(op, level), w, o, level + 1))

    async def serve(conn: Any) -> None:
        while True:
            due, w, o = await queue.get()
            op = plan[w]["ops"][o]
            row = counters[op["kind"]]
            row["lag_max"] = max(row["lag_max"], time.monotonic() - due)
            try:
                await replay(conn, op["items"])
            except Exception as exc:  # noqa: BLE001 - counted and shown once: a simulator must go on
                errors.append(f"{op['kind']}: {exc!r}")
                if len(errors) == 1:
                    print(f"simulator error: {errors[0]}", file=sys.stderr, flush=True)
                if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    await conn.rollback()
                continue
            row["done"] += 1

    async def report() -> None:
        while not stopping.is_set():
            print(json.dumps({"ops": counters, "errors": len(errors)}), flush=True)
            await asyncio.sleep(1.0)

    tasks = [asyncio.create_task(serve(conn)) for conn in conns]
    tasks += [asyncio.create_task(dispatch()), asyncio.create_task(report())]
    await stopping.wait()
    for task in tasks:
        task.cancel()
    for conn in conns:
        await conn.close()
    return 0


async def replay(conn: Any, items: list[tuple]) -> None:
    """Issue recorded statements, one round trip each as the product does: BEGIN before the first
    statement recorded inside a transaction, COMMIT where the product committed."""
    in_tx = False
    async with conn.cursor() as cur:
        for item in items:
            if item[0] == "commit":
                if in_tx:
                    await cur.execute("COMMIT")
                in_tx = False
                continue
            _, sql, atomic = item
            if atomic and not in_tx:
                await cur.execute("BEGIN")
                in_tx = True
            await cur.execute(sql)
        if in_tx:
            await cur.execute("COMMIT")


if __name__ == "__main__":
    sys.exit(main())
