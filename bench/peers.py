"""distsched side by side with the best Django peers and a raw SQL floor, one client pattern, one run.

    .venv/bin/python bench/peers.py --db sqlite                          # full size: 10,000 jobs, 2 repeats
    .venv/bin/python bench/peers.py --db postgres
    .venv/bin/python bench/peers.py --db postgres --jobs 2000 --repeat 1  # quick pass, a few minutes
    .venv/bin/python bench/peers.py --db sqlite --systems distsched,raw

The systems (``--systems``, default all but ``distsched-async``; procrastinate is PostgreSQL only):

- ``distsched``: ``distsched_app.services.enqueue.enqueue(Job(task_name="tests.noop"), now=...)``
  (the call behind the framework backend and ``POST /api/runs``; the ``Scheduler`` facade
  has no enqueue), drained by ``runworker --burst --poll-interval 0.05``, at K > 1 one
  ``runworker --processes K`` (Django set up once, K workers forked; ``--separate-workers``:
  K separate processes);
- ``distsched-async``: the same, its workers with ``DISTSCHED["SYNCHRONOUS_CLAIMS"] = False``
  (claims that commit without waiting for the disk; only when named);
- ``framework``: distsched through ``django.tasks`` (``@task def noop()`` +
  ``noop.enqueue()``, ``TASKS["default"]`` = ``distsched_app.backends.DistschedBackend``),
  the same workers;
- ``q2``: django-q2, ``async_task("bench_tasks.plain.noop")`` on the ORM broker (same
  database), drained by one ``qcluster`` with ``workers: K`` (it has no burst mode:
  stopped with SIGTERM once the database shows every job done);
- ``procrastinate``: ``noop.defer()`` through its Django integration, drained by K
  ``procrastinate worker --one-shot --concurrency 1`` processes;
- ``raw``: no framework (``bench/_raw_queue.py``, the driver itself): one ``INSERT`` per job
  in its own transaction; K processes each looping one claim transaction
  (``UPDATE ... WHERE id = (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING`` on PostgreSQL,
  ``BEGIN IMMEDIATE`` + ``SELECT`` + ``UPDATE`` on SQLite) and one completion transaction
  per job, exiting when nothing is left. The fixed reference floor.

Every Django process runs ``bench_tasks.peers_settings`` (``tests.settings`` + the peers'
apps: same database, same tuning). Per repetition (``--repeat``, 2), per worker count K
(``--workers``, 1,4), each system in turn (the order reversed on every other leg; the
machine is shared and noisy) runs one leg:

1. its tables emptied; ``--jobs`` (10,000) no-op jobs enqueued by one fresh process, one
   call per job, each its own transaction (autocommit), each call but the first (a warm-up) timed:
   **ms per enqueue** (median of the calls; mean too), SQL statements and new
   connections per enqueue (counted through Django's cursor; the raw loop's is one
   ``INSERT`` by construction); then ``ANALYZE``;
2. K workers spawned: **drain jobs/s** = N / (the first ``Popen`` .. the database
   showing N jobs done, polled every 50 ms), start-up included; **spawn -> first job
   done** = the first job's completion as the database records it (distsched
   ``finished_at``, django-q2 ``Task.stopped``, procrastinate's ``succeeded`` event, the
   raw loop's ``done_at``) - the wall clock just before the first ``Popen``;
3. checked: every job ran exactly once, from the database (distsched: N runs
   ``succeeded``, ``attempts`` 1, one ``started`` and one ``succeeded`` event each;
   django-q2: N successful ``Task`` rows of ``attempt_count`` 1, the ORM queue empty;
   procrastinate: N jobs ``succeeded``, one ``started`` event each; raw: N rows ``done``,
   ``attempts`` 1), and every worker exited 0. A leg that fails this is a problem: the
   script exits 1.

Reported: medians over the repetitions per system, with ratios to the best peer
(django-q2, procrastinate: the better of the two for each figure) and to the raw loop;
``bench/results/peers-<db>.json``. Runs itself under ``/tmp/bench-venv-X.Y`` (see
``bench/README.md``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import _common as c
import _tasks_common as tc

NAME = "peers"
SETTINGS = "bench_tasks.peers_settings"
MODULES = ("django_tasks_db", "django_q", "procrastinate")
RAW = str(c.ROOT / "bench" / "_raw_queue.py")
POLL = 0.05


# -- the systems -------------------------------------------------------------------------------------


class System:
    name = label = ""
    peer = False  # a peer framework (the "best peer" ratios)
    postgres_only = False
    exits_by_itself = True  # a burst worker; otherwise stopped with SIGTERM once drained
    enqueues_as = ""  # ``peers_enqueue``'s system, when not this one's name (a variant's workers differ)

    def enqueue(self, count: int) -> dict[str, Any]:
        system = self.enqueues_as or self.name
        done = subprocess.run(
            [sys.executable, str(c.ROOT / "manage.py"), "peers_enqueue", "--system", system, "--count", str(count)],
            cwd=c.ROOT,
            env=os.environ.copy(),
            capture_output=True,
            text=True,
            timeout=max(300.0, count / 20),
        )
        if done.returncode != 0:
            raise SystemExit(f"{self.label}: peers_enqueue failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    def workers(self, k: int, tag: str) -> list[tuple[list[str], dict[str, str]]]:
        """The worker processes to spawn: (command, extra environment) each."""
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError

    def waiting(self) -> int:
        """Jobs enqueued and not yet done (checked after the enqueue)."""
        raise NotImplementedError

    def done(self) -> int:
        """Jobs in a final state."""
        raise NotImplementedError

    def first_done(self) -> float | None:
        """The first job's completion, epoch seconds, as the database records it."""
        raise NotImplementedError

    def all_ready(self, k: int) -> float | None:
        """When the last of K workers finished its first job (epoch seconds; distsched only)."""
        return None

    def check(self, expected: int) -> tuple[dict[str, Any], list[str]]:
        """What the database says about the leg, and what is wrong with it (exactly once)."""
        raise NotImplementedError


def _scalar(sql: str, params: list[Any] | None = None) -> Any:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        row = cursor.fetchone()
    return row[0] if row else None


def _epoch(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


class Distsched(System):
    name, label = "distsched", "distsched"
    task = "tests.noop"

    # K > 1: one ``runworker --processes K`` (Django set up once, K children forked), the
    # recommended way; ``--separate-workers`` spawns K ``runworker`` processes instead.
    separate = False
    env: dict[str, str] = {}  # the workers' extra environment (``bench_tasks.settings`` reads it)

    def workers(self, k: int, tag: str) -> list[tuple[list[str], dict[str, str]]]:
        if k > 1 and not self.separate:
            extra = ["--processes", str(k)]
            return [(c.worker_command(worker_id=tag, poll_interval=POLL, burst=True, extra=extra), dict(self.env))]
        return [
            (c.worker_command(worker_id=f"{tag}-{i}", poll_interval=POLL, burst=True, extra=[]), dict(self.env))
            for i in range(k)
        ]

    def reset(self) -> None:
        c.reset_tables()

    def waiting(self) -> int:
        from distsched_app.models import Run, RunState

        return Run.objects.filter(state=RunState.PENDING, task_name=self.task).count()

    def done(self) -> int:
        from distsched_app.models import TERMINAL_STATES, Run

        return Run.objects.filter(state__in=TERMINAL_STATES).count()

    def first_done(self) -> float | None:
        from django.db.models import Min

        from distsched_app.models import Run

        return _epoch(Run.objects.aggregate(t=Min("finished_at"))["t"])

    def all_ready(self, k: int) -> float | None:
        from django.db.models import Min

        from distsched_app.models import EventType, RunEvent

        firsts = (
            RunEvent.objects.filter(event_type=EventType.SUCCEEDED)
            .order_by()
            .values("worker_id")
            .annotate(t=Min("created_at"))
        )
        times = [row["t"] for row in firsts]
        return _epoch(max(times)) if len(times) == k else None  # a worker that ran nothing was never ready

    def check(self, expected: int) -> tuple[dict[str, Any], list[str]]:
        from django.db.models import Count

        from distsched_app.models import Run

        states = c.states()
        events = c.event_coverage()
        attempts = {r["attempts"]: r["n"] for r in Run.objects.order_by().values("attempts").annotate(n=Count("id"))}
        tasks = set(Run.objects.order_by().values_list("task_name", flat=True).distinct())
        problems = []
        if states != {"succeeded": expected}:
            problems.append(f"states {states}, expected {expected} succeeded")
        if attempts != {1: expected}:
            problems.append(f"attempts {attempts}, expected {expected} runs of 1")
        for kind in ("started", "succeeded"):
            got = events.get(kind, {"events": 0, "runs": 0})
            if got["events"] != expected or got["runs"] != expected:
                problems.append(f"{kind} events: {got}, expected {expected} over {expected} runs")
        if tasks != {self.task}:
            problems.append(f"task names {sorted(tasks)}, expected {self.task}")
        return {"states": states, "attempts": attempts, "events": events}, problems


class Framework(Distsched):
    name, label = "framework", "distsched via django.tasks"
    task = "bench_tasks.tasks.noop"


class DistschedAsyncClaims(Distsched):
    """distsched's workers with ``SYNCHRONOUS_CLAIMS = False`` (the same enqueue)."""

    name, label = "distsched-async", "distsched, SYNCHRONOUS_CLAIMS=False"
    enqueues_as = "distsched"
    env = {"BENCH_DISTSCHED_SYNCHRONOUS_CLAIMS": "0"}


class DjangoQ2(System):
    name, label, peer = "q2", "django-q2", True
    exits_by_itself = False
    func = "bench_tasks.plain.noop"

    def workers(self, k: int, tag: str) -> list[tuple[list[str], dict[str, str]]]:
        return [(["qcluster"], {"BENCH_Q_WORKERS": str(k)})]

    def _tables(self) -> list[str]:
        from django_q.models import OrmQ, Task

        return [OrmQ._meta.db_table, Task._meta.db_table]

    def reset(self) -> None:
        from django.db import connection

        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(f"TRUNCATE {', '.join(self._tables())}")
            else:
                for table in self._tables():
                    cursor.execute(f"DELETE FROM {table}")

    def waiting(self) -> int:
        from django_q.models import OrmQ

        return OrmQ.objects.count()

    def done(self) -> int:
        from django_q.models import Task

        return Task.objects.count()

    def first_done(self) -> float | None:
        from django.db.models import Min
        from django_q.models import Task

        return _epoch(Task.objects.aggregate(t=Min("stopped"))["t"])

    def check(self, expected: int) -> tuple[dict[str, Any], list[str]]:
        from django.db.models import Count
        from django_q.models import OrmQ, Task

        rows = Task.objects.order_by()
        success = {str(r["success"]): r["n"] for r in rows.values("success").annotate(n=Count("id"))}
        attempts = {r["attempt_count"]: r["n"] for r in rows.values("attempt_count").annotate(n=Count("id"))}
        funcs = set(rows.values_list("func", flat=True).distinct())
        queued = OrmQ.objects.count()
        problems = []
        if success != {"True": expected}:
            problems.append(f"Task rows by success {success}, expected {expected} successful")
        if attempts != {1: expected}:
            problems.append(f"attempt_count {attempts}, expected {expected} of 1")
        if queued:
            problems.append(f"{queued} OrmQ rows left (not acknowledged)")
        if funcs != {self.func}:
            problems.append(f"funcs {sorted(funcs)}")
        return {"success": success, "attempt_count": attempts, "ormq_left": queued}, problems


class Procrastinate(System):
    name, label, peer, postgres_only = "procrastinate", "procrastinate", True, True
    final = "('succeeded', 'failed', 'aborted')"

    def workers(self, k: int, tag: str) -> list[tuple[list[str], dict[str, str]]]:
        return [
            (
                [
                    "procrastinate",
                    "worker",
                    "--one-shot",
                    "--concurrency",
                    "1",
                    "--queues",
                    "default",
                    "--name",
                    f"{tag}-{i}",
                ],
                {},
            )
            for i in range(k)
        ]

    def reset(self) -> None:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(
                "TRUNCATE procrastinate_events, procrastinate_jobs, procrastinate_workers, "
                "procrastinate_periodic_defers RESTART IDENTITY CASCADE"
            )

    def waiting(self) -> int:
        return _scalar("SELECT count(*) FROM procrastinate_jobs WHERE status = 'todo' AND task_name = 'noop'")

    def done(self) -> int:
        return _scalar(f"SELECT count(*) FROM procrastinate_jobs WHERE status IN {self.final}")

    def first_done(self) -> float | None:
        at = _scalar("SELECT extract(epoch FROM min(at)) FROM procrastinate_events WHERE type = 'succeeded'")
        return float(at) if at is not None else None

    def check(self, expected: int) -> tuple[dict[str, Any], list[str]]:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT status::text, count(*) FROM procrastinate_jobs GROUP BY 1")
            states = dict(cursor.fetchall())
            cursor.execute(
                "SELECT type::text, count(*), count(DISTINCT job_id) FROM procrastinate_events GROUP BY 1 ORDER BY 1"
            )
            events = {kind: {"events": n, "jobs": jobs} for kind, n, jobs in cursor.fetchall()}
        problems = []
        if states != {"succeeded": expected}:
            problems.append(f"states {states}, expected {expected} succeeded")
        for kind in ("started", "succeeded"):
            got = events.get(kind, {"events": 0, "jobs": 0})
            if got["events"] != expected or got["jobs"] != expected:
                problems.append(f"{kind} events: {got}, expected {expected} over {expected} jobs")
        return {"states": states, "events": events}, problems


class Raw(System):
    name, label = "raw", "raw SQL loop"

    def enqueue(self, count: int) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, RAW, "enqueue", "--count", str(count)],
            cwd=c.ROOT,
            capture_output=True,
            text=True,
            timeout=max(300.0, count / 20),
        )
        if done.returncode != 0:
            raise SystemExit(f"raw enqueue failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    def workers(self, k: int, tag: str) -> list[tuple[list[str], dict[str, str]]]:
        return [([RAW, "work"], {}) for _ in range(k)]

    def reset(self) -> None:
        from django.db import connections

        connections.close_all()  # SQLite: no open statement on the table it drops
        subprocess.run([sys.executable, RAW, "setup"], cwd=c.ROOT, check=True, timeout=60)

    def waiting(self) -> int:
        return _scalar("SELECT count(*) FROM raw_jobs WHERE state = 'queued'")

    def done(self) -> int:
        return _scalar("SELECT count(*) FROM raw_jobs WHERE state = 'done'")

    def first_done(self) -> float | None:
        at = _scalar("SELECT min(done_at) FROM raw_jobs")
        return float(at) if at is not None else None

    def check(self, expected: int) -> tuple[dict[str, Any], list[str]]:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT state, attempts, count(*) FROM raw_jobs GROUP BY 1, 2")
            rows = {f"{state}/{attempts}": n for state, attempts, n in cursor.fetchall()}
        problems = [] if rows == {"done/1": expected} else [f"state/attempts {rows}, expected {expected} done/1"]
        return {"state_attempts": rows}, problems


SYSTEMS: dict[str, System] = {
    s.name: s for s in (Distsched(), Framework(), DistschedAsyncClaims(), DjangoQ2(), Procrastinate(), Raw())
}


# -- the run -------------------------------------------------------------------------------------


def main() -> int:
    p = c.parser(__doc__.splitlines()[0])
    default = ",".join(n for n in SYSTEMS if n != DistschedAsyncClaims.name)  # the variant only when asked for
    p.add_argument("--systems", default=default, help=f"Comma-separated subset of {', '.join(SYSTEMS)}.")
    p.add_argument("--jobs", type=int, default=10_000, help="N jobs per leg (enqueued, then drained).")
    p.add_argument("--repeat", type=int, default=2, help="Repetitions; medians are reported.")
    p.add_argument("--workers", default=[1, 4], type=worker_counts, help="Worker counts K, e.g. 1,4 (the default).")
    p.add_argument(
        "--separate-workers",
        action="store_true",
        help="distsched at K > 1: K separate runworker processes instead of one runworker --processes K.",
    )
    p.add_argument("--timeout", type=float, default=None, help="Give up on a drain after this many seconds.")
    p.add_argument(
        "--conn-max-age",
        default="none",
        help="CONN_MAX_AGE of every Django process: 'none' (persistent, the default) or seconds (the project has 0).",
    )
    args = p.parse_args()
    names = [s.strip() for s in args.systems.split(",") if s.strip()]
    if not names or set(names) - set(SYSTEMS):
        p.error(f"--systems takes a comma-separated subset of {', '.join(SYSTEMS)}")
    if args.jobs < 2 or args.repeat < 1:
        p.error("--jobs must be at least 2 and --repeat at least 1")
    notes: list[str] = []
    if args.db == "sqlite" and "procrastinate" in names:
        names.remove("procrastinate")
        notes.append("procrastinate skipped: PostgreSQL only")
    if "framework" in names and not tc.distsched_backend_exists():
        print(tc.NOT_BUILT, file=sys.stderr)
        return 1
    tc.ensure_packages(sys.argv, MODULES)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tc.BENCH), os.environ.get("PYTHONPATH")]))
    os.environ["BENCH_TASKS_SYSTEM"] = "distsched"  # every Django process: TASKS["default"] is distsched's
    os.environ["BENCH_CONN_MAX_AGE"] = args.conn_max_age
    systems = [SYSTEMS[n] for n in names]
    Distsched.separate = args.separate_workers  # the framework system inherits it
    with c.scratch_database(NAME, args, settings=SETTINGS):
        versions = package_versions()
        c.header(
            f"peers: {', '.join(s.label for s in systems)}; {args.jobs} no-op jobs, workers {args.workers}, "
            f"{args.repeat} repetition(s), CONN_MAX_AGE {args.conn_max_age}; "
            + ", ".join(f"{k} {v}" for k, v in versions.items()),
            args,
        )
        samples, checks, problems = measure(args, systems)
        summary = {s.name: {k: median(v) for k, v in samples[s.name].items()} for s in systems}
        ratios = compare(args, systems, summary)
        report(args, systems, summary, ratios, notes)
        c.write_results(
            NAME,
            args,
            {
                "ok": not problems,
                "versions": versions,
                "systems": {s.name: s.label for s in systems},
                "summary": summary,
                "ratios": ratios,
                "samples": samples,
                "checks": checks,
                "problems": problems,
                "notes": notes,
                "settings": {
                    "q2": q2_settings(),
                    "distsched_worker": f"runworker --burst --poll-interval {POLL}"
                    + ("" if args.separate_workers else " (K > 1: one process, --processes K)"),
                    "conn_max_age": args.conn_max_age,
                },
            },
        )
    for problem in problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    return 1 if problems else 0


def worker_counts(text: str) -> list[int]:
    counts = [int(k) for k in text.split(",")]
    if min(counts) < 1:
        raise ValueError(text)
    return counts


def package_versions() -> dict[str, str]:
    import django

    out = {"Django": django.get_version()}
    for package in ("django-tasks", "django-q2", "procrastinate"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            pass
    return out


def q2_settings() -> dict[str, Any]:
    from django.conf import settings

    return {k: v for k, v in settings.Q_CLUSTER.items() if k != "workers"}


def measure(args, systems: list[System]) -> tuple[dict, list, list[str]]:
    samples: dict[str, dict[str, list[float]]] = {s.name: defaultdict(list) for s in systems}
    checks: list[dict[str, Any]] = []
    problems: list[str] = []
    leg = 0
    for rep in range(args.repeat):
        for k in args.workers:
            order = systems if leg % 2 == 0 else systems[::-1]
            leg += 1
            for system in order:
                tag = f"{system.name}-r{rep}-k{k}"
                system.reset()
                got = system.enqueue(args.jobs)
                waiting = system.waiting()
                if waiting != args.jobs:
                    problems.append(f"{tag}: {waiting} jobs waiting after the enqueue, expected {args.jobs}")
                for key in ("median_ms", "mean_ms", "p90_ms", "statements_per", "connects_per"):
                    samples[system.name][f"enqueue_{key}"].append(got[key])
                c.analyze()
                drained = drain(args, system, k, tag)
                problems += drained.pop("problems")
                checks.append({"leg": tag, "enqueue_kinds": got["statement_kinds"], **drained.pop("check")})
                for key, value in drained.items():
                    samples[system.name][f"drain{k}_{key}"].append(value)
                print(
                    f"  {tag:<24} enqueue {got['median_ms']:.3f} ms/job (mean {got['mean_ms']:.3f}, "
                    f"{got['statements_per']:.2f} stmts, {got['connects_per']:.2f} connects)  "
                    f"drain {drained['per_s']:8,.0f} jobs/s ({drained['wall_s']:.2f} s)  "
                    f"first job {drained['first_s']:.2f} s"
                    + (f", all {k} busy {drained['ready_s']:.2f} s" if k > 1 else ""),
                    flush=True,
                )
        print(f"repetition {rep + 1}/{args.repeat} done (load {os.getloadavg()[0]:.2f})", flush=True)
    for system in systems:
        system.reset()
    return {k: dict(v) for k, v in samples.items()}, checks, problems


def spawn(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    """``manage.py <cmd>`` (or a script path, for the raw loop) with the benchmark's environment."""
    argv = [sys.executable, *cmd] if cmd[0].endswith(".py") else [sys.executable, str(c.ROOT / "manage.py"), *cmd]
    with open(log, "ab") as handle:
        proc = subprocess.Popen(
            argv,
            cwd=c.ROOT,
            env={**os.environ, **env},
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    c._children.append(proc)  # stopped at exit by scratch_database, whatever happens
    return proc


def drain(args, system: System, k: int, tag: str) -> dict[str, Any]:
    folder = c.scratch_dir(NAME)
    plan = system.workers(k, tag)
    logs = [folder / f"{tag}-{i}.log" for i in range(len(plan))]
    spawned = time.time()
    start = time.perf_counter()
    procs = [spawn(cmd, log, env) for (cmd, env), log in zip(plan, logs, strict=True)]
    timeout = args.timeout or max(180.0, args.jobs / 20)
    finished = c.wait_for(
        lambda: system.done() >= args.jobs or all(p.poll() is not None for p in procs), timeout=timeout, interval=POLL
    )
    wall = time.perf_counter() - start
    codes = stop(procs, signal_first=not system.exits_by_itself)
    first = system.first_done()
    ready = system.all_ready(k)
    state, problems = system.check(args.jobs)
    if not finished:
        problems.append(f"not drained within {timeout:.0f} s")
    if any(codes):
        problems.append(f"worker exit codes {codes}")
    if problems:
        problems = [f"{system.label} {tag}: {p}" for p in problems]
        for log in logs:
            print(f"--- {log}\n{c.tail(log)}", file=sys.stderr)
    return {
        "wall_s": wall,
        "per_s": args.jobs / wall if not problems else float("nan"),
        "first_s": first - spawned if first is not None else float("nan"),
        "ready_s": ready - spawned if ready is not None else float("nan"),
        "problems": problems,
        "check": {"ok": not problems, "exit_codes": codes, **state},
    }


def stop(procs: list[subprocess.Popen], *, signal_first: bool) -> list[int | None]:
    """Burst workers exit by themselves; a cluster is sent SIGTERM. Stragglers are killed (non-zero code)."""
    if signal_first:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return [proc.returncode for proc in procs]


# -- the report ------------------------------------------------------------------------------------


def metrics(args) -> list[tuple[str, str, bool]]:
    """(label, summary key, higher is better) of the reported figures."""
    first_k = 1 if 1 in args.workers else min(args.workers)
    rows = [
        ("enqueue ms/job (median)", "enqueue_median_ms", False),
        ("enqueue ms/job (mean)", "enqueue_mean_ms", False),
    ]
    rows += [(f"drain K={k} jobs/s", f"drain{k}_per_s", True) for k in args.workers]
    rows.append((f"spawn -> first job done s (K={first_k})", f"drain{first_k}_first_s", False))
    # distsched only: the K-th worker's first job done (every worker running).
    rows += [(f"spawn -> all K busy s (K={k})", f"drain{k}_ready_s", False) for k in args.workers if k > 1]
    return rows


def compare(args, systems: list[System], summary: dict) -> dict[str, dict[str, Any]]:
    """Per metric: the best peer and its value, and every system's ratio to it and to the raw loop."""
    out: dict[str, dict[str, Any]] = {}
    for _, key, higher in metrics(args):
        peers = {s.name: summary[s.name].get(key) for s in systems if s.peer}
        peers = {n: v for n, v in peers.items() if v is not None and v == v}
        best = (max if higher else min)(peers, key=peers.get) if peers else None
        raw = summary.get("raw", {}).get(key)
        row: dict[str, Any] = {"best_peer": best, "best_peer_value": peers.get(best) if best else None}
        for s in systems:
            value = summary[s.name].get(key)
            row[s.name] = {
                "to_best_peer": value / peers[best] if best and value is not None and peers[best] else None,
                "to_raw": value / raw if raw and value is not None else None,
            }
        out[key] = row
    return out


def report(args, systems: list[System], summary: dict, ratios: dict, notes: list[str]) -> None:
    columns = metrics(args)
    print(f"\nmedians of {args.repeat} repetition(s), {args.jobs:,} jobs per leg ({c.vendor()})")
    headers = ["system", *(label for label, _, _ in columns), "stmts/enqueue", "connects/enqueue"]
    rows = [
        [
            s.label,
            *(summary[s.name].get(key, float("nan")) for _, key, _ in columns),
            summary[s.name].get("enqueue_statements_per", float("nan")),
            summary[s.name].get("enqueue_connects_per", float("nan")),
        ]
        for s in systems
    ]
    print(c.table(headers, rows))
    for which, title in (("to_best_peer", "÷ best peer"), ("to_raw", "÷ raw SQL loop")):
        print(f"\n{title} (jobs/s: higher is better; ms and s: lower is better)")
        print(
            c.table(
                ["system", *(label for label, _, _ in columns)],
                [[s.label, *(_ratio(ratios[key][s.name][which]) for _, key, _ in columns)] for s in systems],
            )
        )
    best = {label: ratios[key]["best_peer"] for label, key, _ in columns}
    print("\nbest peer: " + "; ".join(f"{label}: {SYSTEMS[b].label if b else 'n/a'}" for label, b in best.items()))
    for note in notes:
        print(f"note: {note}")


def _ratio(value: float | None) -> str:
    return "n/a" if value is None or value != value else f"x{value:.2f}"


def median(values: list[float]) -> float:
    return c.median([v for v in values if v == v])


if __name__ == "__main__":
    sys.exit(main())
