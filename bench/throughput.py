"""No-op run throughput: K real ``runworker --burst`` processes drain N due runs.

    .venv/bin/python bench/throughput.py --db sqlite --workers 1 --runs 2000 --repeat 3
    .venv/bin/python bench/throughput.py --db postgres --workers 4 --runs 2000 --worker-args "--prefetch 16"

Two rates are reported per repetition:

- ``wall runs/s``: N / (time from spawning the workers until the database
  shows N succeeded runs). Includes process start-up (Django import, worker
  registration), as an operator starting a burst would see it.
- ``window runs/s``: N / (first ``claimed`` event .. last ``succeeded`` event),
  the steady-state rate measured from the events' own timestamps.

``--profile`` instead runs one worker in this process under cProfile and prints
the top entries (no child processes).
"""

from __future__ import annotations

import cProfile
import io
import pstats
import shlex
import sys
import time
from datetime import datetime
from pathlib import Path

import _common as c

NAME = "throughput"
FAILURE_EVENTS = {"failed", "lease_expired", "lease_lost", "marked_dead", "retry_scheduled", "cancelled"}


def main() -> int:
    p = c.parser(__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=1, help="K worker processes.")
    p.add_argument("--runs", type=int, default=2000, help="N due runs per repetition.")
    p.add_argument("--repeat", type=int, default=1, help="Repetitions (fresh runs each); the median is reported.")
    p.add_argument("--poll-interval", type=float, default=0.05)
    p.add_argument("--worker-args", default="", help='Extra runworker flags, e.g. "--prefetch 16".')
    p.add_argument("--timeout", type=float, default=None, help="Give up after this many seconds per repetition.")
    p.add_argument("--profile", action="store_true", help="Profile one in-process worker with cProfile instead.")
    p.add_argument("--profile-top", type=int, default=30)
    args = p.parse_args()
    with c.scratch_database(NAME, args):
        c.header(f"throughput: {args.runs} no-op runs, {args.workers} worker(s)", args)
        if args.profile:
            return profile(args)
        return measure(args)


def measure(args) -> int:
    extra = shlex.split(args.worker_args)
    timeout = args.timeout or max(120.0, args.runs / 50)
    reps = []
    ok = True
    for rep in range(args.repeat):
        c.reset_tables()
        seed = c.seed_due_runs(args.runs, prefix=f"r{rep}")
        c.analyze()
        logs = [c.scratch_dir(NAME) / f"worker-{rep}-{i}.log" for i in range(args.workers)]
        spawned_at = c.now()
        start = time.perf_counter()
        procs = [
            c.spawn(
                c.worker_command(
                    worker_id=f"bench-{rep}-{i}", poll_interval=args.poll_interval, burst=True, extra=extra
                ),
                log,
            )
            for i, log in enumerate(logs)
        ]

        def finished(procs=procs) -> bool:
            return c.succeeded_count() >= args.runs or all(proc.poll() is not None for proc in procs)

        c.wait_for(finished, timeout=timeout, interval=0.05)
        wall = time.perf_counter() - start
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except Exception:  # noqa: BLE001 - a stuck worker is reported below
                proc.kill()
        codes = [proc.returncode for proc in procs]
        done = c.succeeded_count()
        check = verify(args.runs)
        first_claim, last_success = event_window()
        window = (last_success - first_claim).total_seconds() if first_claim and last_success else float("nan")
        startup = (first_claim - spawned_at).total_seconds() if first_claim else float("nan")
        row = {
            "repeat": rep + 1,
            "runs": args.runs,
            "succeeded": done,
            "workers": args.workers,
            "wall_s": wall,
            "wall_runs_per_s": done / wall if wall else float("nan"),
            "startup_s": startup,
            "window_s": window,
            "window_runs_per_s": done / window if window else float("nan"),
            "exit_codes": codes,
            "seed": seed,
            "check": check,
        }
        reps.append(row)
        if done < args.runs or check["problems"] or any(codes):
            ok = False
            print(
                f"repetition {rep + 1}: {done}/{args.runs} succeeded, exit codes {codes}, problems {check['problems']}",
                file=sys.stderr,
            )
            for log in logs:
                print(f"--- {log.name}\n{c.tail(log)}", file=sys.stderr)
    for r in reps:
        if r["check"]["notes"]:
            print(f"repetition {r['repeat']} notes: {'; '.join(r['check']['notes'])}")
    print(
        c.table(
            ["rep", "runs", "workers", "wall s", "wall runs/s", "startup s", "window s", "window runs/s", "events ok"],
            [
                [
                    r["repeat"],
                    r["runs"],
                    r["workers"],
                    r["wall_s"],
                    r["wall_runs_per_s"],
                    r["startup_s"],
                    r["window_s"],
                    r["window_runs_per_s"],
                    "yes" if not r["check"]["problems"] else "NO",
                ]
                for r in reps
            ],
        )
    )
    summary = {
        "median_wall_runs_per_s": c.median([r["wall_runs_per_s"] for r in reps]),
        "median_window_runs_per_s": c.median([r["window_runs_per_s"] for r in reps]),
    }
    print(
        f"median: {summary['median_wall_runs_per_s']:.0f} runs/s wall, "
        f"{summary['median_window_runs_per_s']:.0f} runs/s steady-state window"
    )
    c.write_results(f"{NAME}-w{args.workers}", args, {"ok": ok, "summary": summary, "repetitions": reps})
    return 0 if ok else 1


def verify(expected: int) -> dict:
    """Every run succeeded and has its created/claimed/started/succeeded events.

    Extra events (a prefetched run ``released`` and claimed again, say) are
    reported as notes, not failures; failure events are problems.
    """
    coverage = c.event_coverage()
    states = c.states()
    problems, notes = [], []
    if states.get("succeeded", 0) != expected or sum(states.values()) != expected:
        problems.append(f"states {states}")
    for kind in ("created", "claimed", "started", "succeeded"):
        got = coverage.get(kind, {"events": 0, "runs": 0})
        if got["runs"] != expected:
            problems.append(f"{kind}: {got['runs']} runs have it, expected {expected}")
        if got["events"] != got["runs"]:
            notes.append(f"{kind}: {got['events']} events for {got['runs']} runs")
    for kind in sorted(set(coverage) - {"created", "claimed", "started", "succeeded"}):
        text = f"{kind}: {coverage[kind]['events']} events"
        (problems if kind in FAILURE_EVENTS else notes).append(text)
    return {"states": states, "events": coverage, "problems": problems, "notes": notes}


def event_window() -> tuple[datetime | None, datetime | None]:
    from django.db.models import Max, Min

    from distsched_app.models import EventType, RunEvent

    first = RunEvent.objects.filter(event_type=EventType.CLAIMED).aggregate(t=Min("created_at"))["t"]
    last = RunEvent.objects.filter(event_type=EventType.SUCCEEDED).aggregate(t=Max("created_at"))["t"]
    return first, last


def profile(args) -> int:
    """One worker in this process under cProfile: where does a no-op run's time go?"""
    from distsched_app.worker import Worker

    c.seed_due_runs(args.runs, prefix="prof")
    c.analyze()
    import argparse

    known = argparse.ArgumentParser(add_help=False)
    known.add_argument("--prefetch", type=int)
    known.add_argument("--concurrency", type=int)
    opts, _ = known.parse_known_args(shlex.split(args.worker_args))
    extra = {k: v for k, v in vars(opts).items() if v is not None}  # the runworker flags Worker also takes
    worker = Worker(worker_id="bench-profile", poll_interval=args.poll_interval, **extra)
    prof = cProfile.Profile()
    start = time.perf_counter()
    prof.enable()
    executed = worker.run(burst=True, install_signals=False)
    prof.disable()
    elapsed = time.perf_counter() - start
    print(f"in-process worker: {executed} runs in {elapsed:.2f} s = {executed / elapsed:.0f} runs/s (profiled)")
    out = {}
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf).strip_dirs().sort_stats(key)
        stats.print_stats(args.profile_top)
        text = buf.getvalue()
        print(f"\n--- top {args.profile_top} by {key}\n{_trim(text)}")
        out[key] = text
    c.RESULTS.mkdir(parents=True, exist_ok=True)
    dump = c.RESULTS / f"{NAME}-profile-{args.db}.prof"
    prof.dump_stats(str(dump))
    print(f"profile written to {Path(dump).relative_to(c.ROOT)}")
    c.write_results(f"{NAME}-profile", args, {"runs": executed, "seconds": elapsed, "stats": out})
    return 0


def _trim(text: str) -> str:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("ncalls"):
            return "\n".join(lines[i - 2 if i >= 2 else 0 :])
    return text


if __name__ == "__main__":
    sys.exit(main())
