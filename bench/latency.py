"""Start latency with idle workers, and what idle workers cost, side by side with the peers.

    .venv/bin/python bench/latency.py --db postgres     # distsched, procrastinate, django-tasks-db (~9 min)
    .venv/bin/python bench/latency.py --db sqlite       # distsched, django-tasks-db (~8 min)

**Start latency.** For each system, ``--workers`` idle worker processes with
their default settings (distsched ``runworker``: poll 1 s, LISTEN on
PostgreSQL; django-tasks-db ``db_worker``: poll 1 s; procrastinate ``worker``:
LISTEN/NOTIFY, poll 5 s). Then ``--samples`` times, one at a time: one job
is enqueued (distsched also: a schedule is triggered) in its own transaction
(``transaction.atomic()``), and ``latency = task body start - commit``: the
commit is the enqueuer's ``time.time()`` when its COMMIT returned, the start is the ``time.time()``
the task writes first thing (``bench_tasks/latency_record.py``), the same
point in every system; each system's line "from BEGIN" measures from the enqueuer's
``time.time()`` before its transaction began instead (so it includes the enqueue and its
COMMIT). ``--busy N`` keeps N CPU-bound processes running throughout (a busy machine).
``--claims synchronous,asynchronous`` measures distsched's workers with each setting of
``SYNCHRONOUS_CLAIMS`` in turn (by default only the default, synchronous); ``--modes enqueue`` leaves
out the triggered runs.
Between samples the benchmark waits a random 0-1 s,
so samples fall at every phase of the workers' polls. distsched's goals, from BEGIN:
PostgreSQL p50 <= 5 ms and p99 <= 50 ms; SQLite p99 <= poll + 50 ms.

**Idle cost.** ``--workers`` idle workers for ``--idle-seconds``: the
statements each sends through Django (an ``execute_wrapper`` in every
connection, ``bench_tasks/apps.py``; the listener's own connection is
psycopg's, not Django's, and is counted only by PostgreSQL) and, on
PostgreSQL, the transactions ``pg_stat_database`` counts for the database
(every connection: procrastinate's too). distsched with LISTEN on and off at
poll 1 s, and with LISTEN on at poll 10 s.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _common as c
import _tasks_common as tc

NAME = "latency"
MODULES = ("django_tasks_db", "procrastinate")


def main() -> int:
    p = c.parser(__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=200, help="Latency samples per system and mode.")
    p.add_argument("--workers", type=int, default=2, help="Idle worker processes per system.")
    p.add_argument("--poll-interval", type=float, default=1.0, help="distsched's and django-tasks-db's poll.")
    p.add_argument("--idle-seconds", type=float, default=30.0, help="Length of each idle-cost window.")
    p.add_argument("--systems", default="distsched,procrastinate,peer", help="Comma-separated subset.")
    p.add_argument("--skip-idle", action="store_true", help="Measure start latency only.")
    p.add_argument(
        "--busy", type=int, default=0, help="Keep the machine busy: this many CPU-bound processes run throughout."
    )
    p.add_argument(
        "--claims",
        default="synchronous",
        help="distsched's claim commits, comma-separated legs: synchronous (the default setting), asynchronous "
        "(SYNCHRONOUS_CLAIMS = False).",
    )
    p.add_argument(
        "--modes",
        default="enqueue,trigger",
        help="distsched's legs, comma-separated: enqueue (a framework task's enqueue()), trigger (a schedule's).",
    )
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    tc.ensure_packages(sys.argv, MODULES)
    random.seed(args.seed)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if args.db == "sqlite" and "procrastinate" in systems:
        systems.remove("procrastinate")  # PostgreSQL only
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tc.BENCH), os.environ.get("PYTHONPATH")]))
    if args.db == "postgres":
        os.environ["BENCH_PROCRASTINATE"] = "1"
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        return run(args, systems)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


def run(args, systems: list[str]) -> int:
    with c.scratch_database(NAME, args, settings=tc.SETTINGS):
        busy = f", {args.busy} CPU-bound processes beside them" if args.busy else ""
        c.header(f"start latency and idle cost: {args.workers} idle workers per system{busy}", args)
        latency = measure_latency(args, systems)
        idle = {} if args.skip_idle else measure_idle(args, systems)
        report(args, latency, idle)
        c.write_results(NAME, args, {"latency": latency, "idle": idle})
    return 0


# -- the systems -----------------------------------------------------------------------------------


def worker_command(system: str, worker_id: str, poll: float) -> list[str]:
    if system == "distsched":
        return ["runworker", "--worker-id", worker_id, "--poll-interval", str(poll)]
    if system == "peer":
        return ["db_worker", "--no-reload", "--no-startup-delay", "--interval", str(poll), "--queue-name", "*",
                "--backend", "peer", "--worker-id", worker_id, "-v", "0"]  # fmt: skip
    return ["procrastinate", "worker", "--concurrency", "1", "--queues", "default", "--name", worker_id]


LABELS = {"distsched": "distsched", "peer": "django-tasks-db", "procrastinate": "procrastinate"}
# distsched's claim commits (``--claims``): the workers' environment for each (``bench_tasks.settings``).
CLAIMS: dict[str, dict[str, str]] = {
    "synchronous": {},
    "asynchronous": {"BENCH_DISTSCHED_SYNCHRONOUS_CLAIMS": "0"},
}


def enqueuer(system: str, mode: str):
    """A function that makes one job claimable in its own transaction and returns its key."""
    if system == "distsched" and mode == "trigger":
        from distsched_app import Scheduler
        from distsched_app.errors import DuplicateName

        scheduler = Scheduler()
        later = c.now().replace(year=c.now().year + 1)  # never due: triggered only
        try:
            scheduler.create_schedule(
                name="latency", task_name="bench.latency_probe_run", interval_seconds=86400, start_at=later
            )
        except DuplicateName:  # an earlier leg's (``--claims`` with both kinds)
            pass

        def trigger(key: str) -> str:  # the key is the run's id, known once triggered
            return f"run:{scheduler.trigger('latency').pk}"

        return trigger
    if system == "procrastinate":
        from bench_tasks.procrastinate_tasks import latency_probe as procrastinate_probe

        def defer(key: str) -> str:
            procrastinate_probe.defer(key=key)
            return key

        return defer
    from bench_tasks.tasks import latency_probe

    task = latency_probe.using(backend="distsched" if system == "distsched" else "peer")

    def enqueue(key: str) -> str:
        task.enqueue(key)
        return key

    return enqueue


class Starts:
    """Reads ``$BENCH_LATENCY_FILE`` as the probes append to it."""

    def __init__(self, path: Path) -> None:
        path.touch()
        self.handle = path.open()
        self.seen: dict[str, float] = {}
        self._partial = ""

    def wait(self, key: str, timeout: float) -> float | None:
        deadline = time.monotonic() + timeout
        while key not in self.seen:
            chunk = self.handle.read()
            if chunk:
                lines = (self._partial + chunk).split("\n")
                self._partial = lines.pop()
                for line in lines:
                    name, _, at = line.rpartition(" ")
                    self.seen[name] = float(at)
                continue
            if time.monotonic() > deadline:
                return None
            time.sleep(0.0005)
        return self.seen[key]


def start_workers(args, system: str, tag: str, poll: float, env: dict[str, str]) -> list:
    folder = c.scratch_dir(NAME)
    children = []
    for i in range(args.workers):
        worker_env = {"BENCH_TASKS_SYSTEM": "distsched" if system == "distsched" else "peer", **env}
        if "BENCH_QUERY_COUNT_FILE" in env:
            worker_env["BENCH_QUERY_COUNT_FILE"] = f"{env['BENCH_QUERY_COUNT_FILE']}.{i}"
        children.append(c.spawn(worker_command(system, f"{tag}-{i}", poll), folder / f"{tag}-{i}.log", env=worker_env))
    return children


def stop_workers(children: list) -> None:
    import signal

    for proc in children:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in children:
        try:
            proc.wait(timeout=20)
        except Exception:  # noqa: BLE001 - a straggler is killed
            proc.kill()
            proc.wait()


# -- start latency ---------------------------------------------------------------------------------


def measure_latency(args, systems: list[str]) -> dict[str, Any]:
    from django.db import transaction

    out: dict[str, Any] = {}
    claims = [k.strip() for k in args.claims.split(",") if k.strip()]
    if not set(claims) <= set(CLAIMS) or not claims:
        raise SystemExit(f"--claims: a comma-separated subset of {', '.join(CLAIMS)}, not {args.claims!r}")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not set(modes) <= {"enqueue", "trigger"} or not modes:
        raise SystemExit(f"--modes: a comma-separated subset of enqueue, trigger, not {args.modes!r}")
    plans = [
        (s, m, k)
        for s in systems
        for m in (modes if s == "distsched" else ("enqueue",))
        for k in (claims if s == "distsched" else [""])
    ]
    for system, mode, kind in plans:
        label = f"{LABELS[system]} {mode}" + (f", {kind} claims" if kind and claims != ["synchronous"] else "")
        tag = f"{system}-{mode}" + (f"-{kind}" if kind else "")
        path = c.scratch_dir(NAME) / f"starts-{tag}.txt"
        os.environ["BENCH_LATENCY_FILE"] = str(path)  # inherited by the workers
        starts = Starts(path)
        children = start_workers(args, system, tag, args.poll_interval, CLAIMS.get(kind, {}))
        make = enqueuer(system, mode)
        try:
            for i in range(3):  # warm-up: the workers boot and settle; not recorded
                if starts.wait(make(f"warm-{system}-{mode}-{i}"), timeout=120) is None:
                    raise SystemExit(f"{label}: the workers never ran a job:\n" + logs(tag))
            time.sleep(2.0)
            values: list[float] = []
            from_begin: list[float] = []
            for i in range(args.samples):
                time.sleep(random.uniform(0.0, 1.0))  # any phase of the workers' polls
                begun = time.time()  # the enqueueing transaction starts
                with transaction.atomic():  # the enqueue's own work happens before the commit
                    key = make(f"{system}-{mode}-{i}")
                committed = time.time()  # the commit returned
                started = starts.wait(key, timeout=30)
                if started is None:
                    raise SystemExit(f"{label}: sample {i} never started:\n" + logs(tag))
                values.append((started - committed) * 1000)
                from_begin.append((started - begun) * 1000)
        finally:
            stop_workers(children)
        out[label] = summary(values)
        out[f"{label} from BEGIN"] = summary(from_begin)
        for name in (label, f"{label} from BEGIN"):
            print(f"  {name:<60} " + "  ".join(f"{k} {v:8.1f} ms" for k, v in out[name].items() if k != "n"))
    return out


def logs(tag: str) -> str:
    return "\n".join(c.tail(p, 15) for p in sorted(c.scratch_dir(NAME).glob(f"{tag}-[0-9]*.log")))


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": c.percentile(values, 50),
        "p90": c.percentile(values, 90),
        "p99": c.percentile(values, 99),
        "max": max(values),
    }


# -- idle cost -------------------------------------------------------------------------------------


def measure_idle(args, systems: list[str]) -> dict[str, Any]:
    from django.db import connection

    plans: list[tuple[str, str, float, dict[str, str]]] = []
    if "distsched" in systems and connection.vendor == "postgresql":
        plans.append(("distsched", "LISTEN on, poll 1 s (defaults)", 1.0, {}))
        plans.append(("distsched", "LISTEN off, poll 1 s", 1.0, {"BENCH_DISTSCHED_LISTEN": "0"}))
        plans.append(("distsched", "LISTEN on, poll 10 s", 10.0, {}))
    elif "distsched" in systems:
        plans.append(("distsched", "poll 1 s (default)", 1.0, {}))
        plans.append(("distsched", "poll 10 s", 10.0, {}))
    if "procrastinate" in systems:
        plans.append(("procrastinate", "LISTEN on, poll 5 s (defaults)", 1.0, {}))
    if "peer" in systems:
        plans.append(("peer", "poll 1 s (default)", 1.0, {}))
    out: dict[str, Any] = {}
    for n, (system, what, poll, env) in enumerate(plans):
        counts = c.scratch_dir(NAME) / f"queries-{n}"
        children = start_workers(args, system, f"idle-{n}", poll, {**env, "BENCH_QUERY_COUNT_FILE": str(counts)})
        try:
            time.sleep(8.0)  # boot, register, settle into the idle loop
            before, tx_before = statement_counts(counts, args.workers), transactions()
            time.sleep(args.idle_seconds)
            after, tx_after = statement_counts(counts, args.workers), transactions()
        finally:
            stop_workers(children)
        label = f"{LABELS[system]}, {what}"
        row: dict[str, Any] = {}
        if before and after and system != "procrastinate":
            rates = [(a[1] - b[1]) / (a[0] - b[0]) for a, b in zip(after, before, strict=True)]
            row["statements_per_s_per_worker"] = sum(rates) / len(rates)
        if tx_before is not None and tx_after is not None:
            row["pg_transactions_per_s_per_worker"] = (tx_after[1] - tx_before[1]) / (
                (tx_after[0] - tx_before[0]) * args.workers
            )
        out[label] = row
        print(f"  {label:<44} " + "  ".join(f"{k} {v:.2f}" for k, v in row.items()))
    return out


def statement_counts(prefix: Path, workers: int) -> list[tuple[float, int]]:
    rows = []
    for i in range(workers):
        try:
            at, count = Path(f"{prefix}.{i}").read_text().split()
        except (OSError, ValueError):
            return []
        rows.append((float(at), int(count)))
    return rows


def transactions() -> tuple[float, int] | None:
    """(monotonic time, commits + rollbacks) of this database, as PostgreSQL counts them."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()")
        (count,) = cursor.fetchone()
    return time.monotonic(), int(count) - 2  # less this reading's own two statements


# -- report ----------------------------------------------------------------------------------------


def report(args, latency: dict[str, Any], idle: dict[str, Any]) -> None:
    print(f"\nstart latency (task body start - commit, or - BEGIN), {args.samples} samples, ms")
    print(f"  {'system':<50} {'p50':>8} {'p90':>8} {'p99':>8} {'max':>8}")
    for label, row in latency.items():
        print(f"  {label:<50} {row['p50']:8.1f} {row['p90']:8.1f} {row['p99']:8.1f} {row['max']:8.1f}")
    goals = []
    for label, row in latency.items():
        if not label.startswith("distsched ") or not label.endswith(" from BEGIN"):
            continue
        name = label.removesuffix(" from BEGIN")
        if c.vendor() == "postgresql":  # the goals count from the enqueueing transaction's start
            goals.append((f"{name}: p50 <= 5 ms from BEGIN", row["p50"] <= 5))
            goals.append((f"{name}: p99 <= 50 ms from BEGIN", row["p99"] <= 50))
        else:
            bound = args.poll_interval * 1000 + 50
            goals.append((f"{name}: p99 <= poll + 50 ms ({bound:.0f} ms) from BEGIN", row["p99"] <= bound))
    for goal, met in goals:
        print(f"  goal {goal}: {'met' if met else 'NOT met'}")
    if idle:
        print(f"\nidle cost over {args.idle_seconds:.0f} s, per worker")
        for label, row in idle.items():
            print(f"  {label:<44} " + "  ".join(f"{k} {v:.2f}" for k, v in row.items()))


if __name__ == "__main__":
    sys.exit(main())
