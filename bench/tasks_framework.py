"""distsched vs django-tasks-db through the same ``django.tasks`` client code, side by side.

    .venv/bin/python bench/tasks_framework.py --db sqlite --jobs 2000 --repeat 3
    .venv/bin/python bench/tasks_framework.py --db postgres --systems peer     # the peer alone

Both systems run the code in ``bench/bench_tasks`` (a ``@task def noop()`` and
an enqueue loop) with the same settings; only ``TASKS["default"]["BACKEND"]``
differs: ``distsched_app.backends.DistschedBackend`` or
``django_tasks_db.DatabaseBackend``. On Django 5.2 the framework is the
django-tasks backport, on Django 6 ``django.tasks``. If this interpreter lacks
django-tasks-db, the script re-runs itself under ``/tmp/bench-venv-X.Y``
(created once from ``requirements.txt`` + ``bench/requirements.txt``).

Measured per repetition, the systems alternating leg by leg (order reversed on
every other repetition, since the machine is shared and noisy); medians over
``--repeat`` are reported:

- **enqueue**: ``manage.py bench_enqueue`` makes N ``noop.enqueue()`` calls
  from one process, one job and one autocommit transaction each (the first
  one untimed): ms per enqueue, jobs/s, SQL statements per enqueue. Each drain
  leg is seeded this way, so there are two samples per repetition.
- **bulk** (distsched only): N jobs through ``distsched_app.services.enqueue.enqueue_many``
  (a hook in ``bench_enqueue.py``); skipped with a note while it does not exist.
- **trigger** (distsched only): N manual triggers of a schedule of the same task
  (``Scheduler.trigger``, one autocommit transaction each), timed like the enqueues.
- **drain**: K worker processes (``--workers 1,4``) drain the N jobs: wall time
  from spawning them until the database shows N jobs finished (polled every
  50 ms), so it includes process start-up; also the steady-state window
  from the rows' own first start to last finish. Workers:
  ``db_worker --batch --no-reload --no-startup-delay --interval 0 --queue-name '*'``
  and ``runworker --burst --poll-interval 0.05``.
- **start-up**: one job enqueued, one worker spawned: time from the spawn to
  that job's ``finished_at``. ``manage.py version`` (interpreter + ``django.setup()``)
  is timed alongside as the floor every worker pays.

Then the ratios distsched / peer and the issue's goals: enqueue no slower,
bulk >= 10,000 jobs/s, drain >= 5x the peer's (every K), a trigger as cheap as
an enqueue, first job <= 0.5 s after the spawn. Results: ``bench/results/tasks-framework-<db>.json``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import defaultdict

import _common as c
import _tasks_common as tc

NAME = "tasks_framework"  # scratch database and folder; results are tasks-framework-<db>.json


def main() -> int:
    p = c.parser(__doc__.splitlines()[0])
    p.add_argument("--systems", default="distsched,peer", help="Comma-separated: distsched, peer.")
    p.add_argument("--jobs", type=int, default=2000, help="N jobs per enqueue/drain leg.")
    p.add_argument("--workers", default=[1, 4], type=worker_counts, help="Worker counts K, e.g. 1,4 (the default).")
    p.add_argument("--repeat", type=int, default=1, help="Repetitions; medians are reported.")
    p.add_argument("--timeout", type=float, default=None, help="Give up on a drain after this many seconds.")
    args = p.parse_args()
    names = [s.strip() for s in args.systems.split(",") if s.strip()]
    if not names or set(names) - set(tc.SYSTEMS):
        p.error(f"--systems takes a comma-separated subset of {', '.join(tc.SYSTEMS)}")
    if args.jobs < 2 or args.repeat < 1:
        p.error("--jobs must be at least 2 and --repeat at least 1")
    if "distsched" in names and not tc.distsched_backend_exists():
        print(tc.NOT_BUILT, file=sys.stderr)
        return 1
    tc.ensure_packages(sys.argv)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tc.BENCH), os.environ.get("PYTHONPATH")]))
    systems = [tc.SYSTEMS[n] for n in names]
    with c.scratch_database(NAME, args, settings=tc.SETTINGS):
        versions = tc.framework_versions()
        c.header(
            f"tasks framework: {' vs '.join(s.label for s in systems)}, {args.jobs} no-op jobs, "
            f"workers {args.workers}, Django {versions['django']} ({versions['framework']}), "
            f"django-tasks-db {versions['django-tasks-db']}",
            args,
        )
        samples, kinds, problems, notes = measure(args, systems)
        summary = {s.name: {k: median(v) for k, v in samples[s.name].items()} for s in systems}
        ratios, goals = judge(args, summary)
        print_report(args, systems, summary, ratios, goals, kinds, notes)
        c.write_results(
            "tasks-framework",
            args,
            {
                "ok": not problems,
                "versions": versions,
                "systems": names,
                "summary": summary,
                "ratios": ratios,
                "goals": goals,
                "statement_kinds": kinds,
                "samples": samples,
                "problems": problems,
                "notes": notes,
            },
        )
    for problem in problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    return 1 if problems else 0


def worker_counts(text: str) -> list[int]:
    counts = [int(k) for k in text.split(",")]  # argparse turns a ValueError into a one-line usage error
    if min(counts) < 1:
        raise ValueError(text)
    return counts


def measure(args, systems: list[tc.System]) -> tuple[dict, dict, list[str], list[str]]:
    """Every sample per system and metric, statement kinds per system, problems, notes."""
    samples: dict[str, dict[str, list[float]]] = {s.name: defaultdict(list) for s in systems}
    kinds: dict[str, dict[str, int]] = {}
    problems: list[str] = []
    notes: list[str] = []
    bulk = "distsched" in samples
    for rep in range(args.repeat):
        order = systems if rep % 2 == 0 else systems[::-1]
        for k in args.workers:
            for system in order:
                system.reset()
                got = tc.enqueue(system, args.jobs)
                for key in ("ms_per", "per_s", "statements_per"):
                    samples[system.name][f"enqueue_{key}"].append(got[key])
                kinds[system.name] = got["statement_kinds"]
                drained = drain(args, system, k, f"{rep}-{k}")
                problems += drained.pop("problems")
                for key, value in drained.items():
                    samples[system.name][f"drain{k}_{key}"].append(value)
        if bulk:
            tc.SYSTEMS["distsched"].reset()
            got = tc.enqueue(tc.SYSTEMS["distsched"], args.jobs, bulk=True)
            if got.get("skipped"):
                notes.append(f"bulk enqueue skipped: {got['skipped']}")
                bulk = False
            else:
                samples["distsched"]["bulk_per_s"].append(got["per_s"])
                samples["distsched"]["bulk_statements_per"].append(got["statements_per"])
        if "distsched" in samples:
            tc.SYSTEMS["distsched"].reset()
            got = tc.enqueue(tc.SYSTEMS["distsched"], args.jobs, trigger=True)
            for key in ("ms_per", "per_s", "statements_per"):
                samples["distsched"][f"trigger_{key}"].append(got[key])
        for system in order:
            seconds, trouble = startup(args, system, rep)
            problems += trouble
            samples[system.name]["startup_s"].append(seconds)
            samples[system.name]["django_startup_s"].append(tc.django_startup(system))
        print(f"repetition {rep + 1}/{args.repeat} done (load {os.getloadavg()[0]:.2f})", flush=True)
    for s in systems:
        s.reset()
    return {k: dict(v) for k, v in samples.items()}, kinds, problems, notes


def drain(args, system: tc.System, k: int, tag: str) -> dict:
    """K workers drain the enqueued jobs; wall and window rates, and what went wrong."""
    folder = c.scratch_dir(NAME)
    logs = [folder / f"{system.name}-drain-{tag}-{i}.log" for i in range(k)]
    start = time.perf_counter()
    procs = [c.spawn(system.worker(f"bench-{tag}-{i}"), log, env=system.env) for i, log in enumerate(logs)]
    timeout = args.timeout or max(120.0, args.jobs / 10)
    c.wait_for(
        lambda: system.finished() >= args.jobs or all(p.poll() is not None for p in procs),
        timeout=timeout,
        interval=0.05,
    )
    wall = time.perf_counter() - start
    codes = stop(procs)
    states, problems = system.check(args.jobs)
    if any(codes):
        problems.append(f"worker exit codes {codes}")
    if problems:
        problems = [f"{system.label} drain {tag} (K={k}): {p}" for p in problems]
        for log in logs:
            print(f"--- {log}\n{c.tail(log)}", file=sys.stderr)
    first, last = system.window()
    window = (last - first).total_seconds() if first and last else float("nan")
    done = states.get(system.succeeded, 0)
    return {
        "wall_s": wall,
        "wall_per_s": done / wall,
        "window_per_s": done / window if window else float("nan"),
        "problems": problems,
    }


def startup(args, system: tc.System, rep: int) -> tuple[float, list[str]]:
    """Spawn one worker with one job waiting: seconds from the spawn to the job's finish."""
    system.reset()
    tc.enqueue(system, 1)
    log = c.scratch_dir(NAME) / f"{system.name}-startup-{rep}.log"
    spawned = c.now()
    proc = c.spawn(system.worker(f"bench-start-{rep}"), log, env=system.env)
    c.wait_for(lambda: system.finished() >= 1 or proc.poll() is not None, timeout=120, interval=0.05)
    codes = stop([proc])
    states, problems = system.check(1)
    _, finished = system.window()
    if any(codes) or problems or finished is None:
        print(f"--- {log}\n{c.tail(log)}", file=sys.stderr)
        return float("nan"), [f"{system.label} start-up {rep}: exit {codes}, {problems}"]
    return (finished - spawned).total_seconds(), []


def stop(procs) -> list[int | None]:
    """Let burst/batch workers exit by themselves (they have nothing left); kill stragglers."""
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # a stuck worker shows up as a non-zero exit code
            proc.kill()
            proc.wait()
    return [proc.returncode for proc in procs]


# -- verdict and report --------------------------------------------------------


def metric_rows(args) -> list[tuple[str, str]]:
    rows = [
        ("enqueue ms/job", "enqueue_ms_per"),
        ("enqueue jobs/s", "enqueue_per_s"),
        ("SQL statements/enqueue", "enqueue_statements_per"),
        ("bulk enqueue jobs/s", "bulk_per_s"),
        ("bulk SQL statements/job", "bulk_statements_per"),
        ("trigger ms/run", "trigger_ms_per"),
        ("SQL statements/trigger", "trigger_statements_per"),
    ]
    for k in args.workers:
        rows += [
            (f"drain jobs/s, {k} worker(s), wall", f"drain{k}_wall_per_s"),
            (f"drain jobs/s, {k} worker(s), window", f"drain{k}_window_per_s"),
        ]
    return rows + [
        ("start-up: spawn -> first job done s", "startup_s"),
        ("manage.py version (Django start-up) s", "django_startup_s"),
    ]


def judge(args, summary: dict) -> tuple[dict[str, float], dict[str, str]]:
    ours, peer = summary.get("distsched", {}), summary.get("peer", {})
    ratios = {key: ours[key] / peer[key] for _, key in metric_rows(args) if key in ours and key in peer and peer[key]}
    absent = "n/a (distsched not measured)" if not ours else None

    def verdict(ok: bool | None, text: str) -> str:
        return absent or ("n/a" if ok is None else ("PASS" if ok else "MISS")) + f" ({text})"

    enqueue = ratios.get("enqueue_ms_per")
    bulk = ours.get("bulk_per_s")
    drains = {k: ratios.get(f"drain{k}_wall_per_s") for k in args.workers}
    first = ours.get("startup_s")
    triggered = ours.get("trigger_ms_per")
    trigger_ratio = triggered / ours["enqueue_ms_per"] if triggered and ours.get("enqueue_ms_per") else None
    goals = {
        "enqueue no slower than django-tasks-db": verdict(
            None if enqueue is None else enqueue <= 1.0, f"ms ratio {_num(enqueue)}"
        ),
        "bulk enqueue >= 10,000 jobs/s": verdict(None if bulk is None else bulk >= 10_000, f"{_num(bulk)} jobs/s"),
        "drain >= 5x django-tasks-db": verdict(
            None if None in drains.values() else all(r >= 5 for r in drains.values()),
            ", ".join(f"K={k}: {_num(r)}x" for k, r in drains.items()),
        ),
        "a trigger costs what an enqueue costs (same statements, within 25%)": verdict(
            None
            if trigger_ratio is None
            else trigger_ratio <= 1.25 and ours.get("trigger_statements_per") == ours.get("enqueue_statements_per"),
            f"trigger/enqueue ms {_num(trigger_ratio)}, statements {_num(ours.get('trigger_statements_per'))} "
            f"vs {_num(ours.get('enqueue_statements_per'))}",
        ),
        "first job <= 0.5 s after the worker's spawn": verdict(
            None if first is None else first <= 0.5, f"{_num(first)} s"
        ),
    }
    return ratios, goals


def print_report(args, systems, summary, ratios, goals, kinds, notes) -> None:
    headers = ["metric (median)", *(s.label for s in systems), "distsched / peer"]
    rows = [
        [label, *(summary[s.name].get(key, float("nan")) for s in systems), ratios.get(key, float("nan"))]
        for label, key in metric_rows(args)
    ]
    print()
    print(c.table(headers, rows))
    for s in systems:
        print(
            f"{s.label}: statements by kind over the last leg's {args.jobs - 1} timed enqueues: {kinds.get(s.name, {})}"
        )
    for note in notes:
        print(f"note: {note}")
    print("\ngoals (wall rates; lower ratio is better for ms and s, higher for jobs/s):")
    for goal, verdict in goals.items():
        print(f"  {goal}: {verdict}")


def median(values: list[float]) -> float:
    """Median of the samples that exist (a failed leg records NaN)."""
    return c.median([v for v in values if v == v])


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.2f}"


if __name__ == "__main__":
    sys.exit(main())
