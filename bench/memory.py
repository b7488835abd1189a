"""Worker memory: RSS growth of one worker process over many no-op runs.

    .venv/bin/python bench/memory.py --db sqlite --runs 50000
    .venv/bin/python bench/memory.py --db postgres --runs 50000 --warmup 2000

One real ``manage.py runworker --poll-interval 0.05`` process (not ``--burst``,
so it is still alive when the last run is recorded) executes ``--runs`` due
no-op runs created by the real tick. Its ``VmRSS`` (``/proc/<pid>/status``) is
sampled every ``--sample-interval`` seconds; the figure is the RSS when all
runs have succeeded minus the RSS once ``--warmup`` runs had succeeded
(target: <= 5 MB over 50,000 runs). The worker is then stopped with SIGTERM
and must exit 0.
"""

from __future__ import annotations

import shlex
import signal
import sys
import time

import _common as c

NAME = "memory"


def main() -> int:
    p = c.parser(__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=50_000)
    p.add_argument("--warmup", type=int, default=2000, help="Runs executed before the baseline RSS sample.")
    p.add_argument("--poll-interval", type=float, default=0.05)
    p.add_argument("--sample-interval", type=float, default=0.5)
    p.add_argument("--worker-args", default="", help="Extra runworker flags.")
    p.add_argument("--timeout", type=float, default=None)
    args = p.parse_args()
    if args.warmup >= args.runs:
        p.error("--warmup must be smaller than --runs")
    with c.scratch_database(NAME, args):
        c.header(f"worker memory over {args.runs:,} no-op runs", args)
        return measure(args)


def measure(args) -> int:
    start = time.perf_counter()
    seed = c.seed_due_runs(args.runs, prefix="mem")
    c.analyze()
    print(f"seeded {args.runs:,} runs in {time.perf_counter() - start:.1f} s (tick {seed['tick_s']:.1f} s)")
    log = c.scratch_dir(NAME) / "worker.log"
    proc = c.spawn(
        c.worker_command(
            worker_id="bench-memory", poll_interval=args.poll_interval, burst=False, extra=shlex.split(args.worker_args)
        ),
        log,
    )
    timeout = args.timeout or max(300.0, args.runs / 20)
    samples: list[dict] = []
    warm: dict | None = None
    end: dict | None = None
    t0 = time.perf_counter()
    deadline = t0 + timeout
    while time.perf_counter() < deadline and proc.poll() is None:
        done = c.succeeded_count()
        mem = c.rss_mb(proc.pid)
        if mem is None:
            break
        sample = {"t": time.perf_counter() - t0, "runs": done, "rss_mb": mem[0], "hwm_mb": mem[1]}
        samples.append(sample)
        if warm is None and done >= args.warmup:
            warm = sample
        if done >= args.runs:
            end = sample
            break
        time.sleep(args.sample_interval)
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=30)
    except Exception:  # noqa: BLE001 - report a worker that ignores SIGTERM
        proc.kill()
        code = proc.wait()
    if warm is None or end is None:
        print(
            f"worker did not finish: {samples[-1]['runs'] if samples else 0}/{args.runs} runs; exit {code}\n"
            f"{c.tail(log)}",
            file=sys.stderr,
        )
        c.write_results(NAME, args, {"ok": False, "samples": samples})
        return 1
    growth = end["rss_mb"] - warm["rss_mb"]
    measured_runs = end["runs"] - warm["runs"]
    rate = measured_runs / (end["t"] - warm["t"]) if end["t"] > warm["t"] else float("nan")
    first = samples[0]
    print(
        c.table(
            ["point", "runs done", "VmRSS MB", "VmHWM MB", "t s"],
            [
                ["first sample", first["runs"], first["rss_mb"], first["hwm_mb"], first["t"]],
                [f"after warm-up ({args.warmup:,})", warm["runs"], warm["rss_mb"], warm["hwm_mb"], warm["t"]],
                ["all runs succeeded", end["runs"], end["rss_mb"], end["hwm_mb"], end["t"]],
            ],
        )
    )
    per_10k = growth / measured_runs * 10_000 if measured_runs else float("nan")
    if measured_runs < 20_000:
        verdict = "too few runs after warm-up to judge against"
    else:
        verdict = "meets" if growth * 50_000 / measured_runs <= 5 else "MISSES"
    print(
        f"RSS growth after warm-up: {growth:+.2f} MB over {measured_runs:,} runs ({per_10k:+.3f} MB per 10k runs; "
        f"{verdict} <= 5 MB per 50k); {rate:.0f} runs/s; worker exit code {code}"
    )
    c.write_results(
        NAME,
        args,
        {
            "ok": code == 0,
            "growth_mb": growth,
            "growth_mb_per_10k_runs": per_10k,
            "runs_per_s": rate,
            "warm": warm,
            "end": end,
            "exit_code": code,
            "samples": samples,
        },
    )
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
