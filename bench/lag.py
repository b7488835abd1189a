"""Start lag: how late idle workers start runs whose slot has come.

    .venv/bin/python bench/lag.py --db sqlite                       # ticker process + 2 idle workers
    .venv/bin/python bench/lag.py --db postgres --mode with-tick    # the workers tick themselves

K idle workers (``runworker --poll-interval 1``) and either a ticker process
(``manage.py tick --loop --interval 0.2``, ``--mode ticker``) or workers started
with ``--with-tick`` (``--mode with-tick``). Once every worker has registered,
``--schedules`` once-schedules are inserted with slots spread uniformly over
the next ``--duration`` seconds, plus ``--interval-schedules`` interval
schedules firing every ``--interval-seconds`` over the same window (paused at
its end). For every run: ``lag = started_at - scheduled_for``, split into
``created_at - scheduled_for`` (waiting for a tick) and
``started_at - created_at`` (waiting for a worker's poll). Target: p99 <=
poll interval + 50 ms.
"""

from __future__ import annotations

import random
import shlex
import sys
import time
from datetime import timedelta

import _common as c

NAME = "lag"


def main() -> int:
    p = c.parser(__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--poll-interval", type=float, default=1.0)
    p.add_argument("--mode", choices=("ticker", "with-tick"), default="ticker")
    p.add_argument("--tick-interval", type=float, default=0.2, help="manage.py tick --loop --interval (ticker mode).")
    p.add_argument("--duration", type=float, default=20.0, help="Seconds over which slots are spread.")
    p.add_argument("--schedules", type=int, default=300, help="Once-schedules spread over the window.")
    p.add_argument("--interval-schedules", type=int, default=4)
    p.add_argument("--interval-seconds", type=int, default=2)
    p.add_argument("--lead", type=float, default=1.0, help="Seconds between inserting schedules and the first slot.")
    p.add_argument("--worker-args", default="", help="Extra runworker flags.")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    with c.scratch_database(NAME, args):
        c.header(f"start lag: {args.workers} idle workers, poll {args.poll_interval}s, mode {args.mode}", args)
        return measure(args)


def measure(args) -> int:
    from distsched_app.models import Run, RunState, Schedule, Worker, WorkerStatus

    folder = c.scratch_dir(NAME)
    extra = shlex.split(args.worker_args) + (["--with-tick"] if args.mode == "with-tick" else [])
    for i in range(args.workers):
        c.spawn(
            c.worker_command(worker_id=f"lag-{i}", poll_interval=args.poll_interval, burst=False, extra=extra),
            folder / f"worker-{i}.log",
        )
    if args.mode == "ticker":
        c.spawn(["tick", "--loop", "--interval", str(args.tick_interval)], folder / "ticker.log")
    if not c.wait_for(
        lambda: Worker.objects.filter(status=WorkerStatus.ACTIVE).count() >= args.workers, timeout=60, interval=0.1
    ):
        raise SystemExit("workers did not register within 60 s:\n" + c.tail(folder / "worker-0.log"))
    time.sleep(args.poll_interval)  # let every worker settle into its idle poll loop

    rng = random.Random(args.seed)
    start = c.now() + timedelta(seconds=args.lead)
    end = start + timedelta(seconds=args.duration)
    slots = sorted(start + timedelta(seconds=rng.uniform(0, args.duration)) for _ in range(args.schedules))
    created = c.now()

    def once(i: int) -> dict:
        return {"run_at": slots[i], "next_run_at": slots[i], "created_at": created, "updated_at": created}

    def every(i: int) -> dict:
        first = start + timedelta(seconds=rng.uniform(0, args.interval_seconds))
        return {
            "interval_seconds": args.interval_seconds,
            "start_at": first,
            "next_run_at": first,
            "created_at": created,
            "updated_at": created,
        }

    c.bulk_schedules("once", args.schedules, once, "once")
    c.bulk_schedules("every", args.interval_schedules, every, "interval")
    print(
        f"{args.schedules} once + {args.interval_schedules} interval schedules over {args.duration:.0f} s; "
        f"waiting for the window to pass"
    )
    c.wait_for(lambda: c.now() >= end, timeout=args.lead + args.duration + 5, interval=0.2)
    Schedule.objects.filter(kind="interval").update(paused=True)
    window = Run.objects.filter(scheduled_for__lt=end)
    c.wait_for(
        lambda: not window.exclude(state=RunState.SUCCEEDED).exists() and window.count() >= args.schedules,
        timeout=30 + 2 * args.poll_interval,
        interval=0.2,
    )
    c.stop_children()

    rows = list(window.values_list("scheduled_for", "created_at", "started_at", "state"))
    missing = [r for r in rows if r[3] != RunState.SUCCEEDED or r[2] is None]
    if len(rows) < args.schedules:
        logs = ["ticker.log"] if args.mode == "ticker" else []
        logs += [f"worker-{i}.log" for i in range(args.workers)]
        detail = "\n".join(f"--- {name}\n{c.tail(folder / name)}" for name in logs)
        print(f"only {len(rows)} runs were created for {args.schedules} once-schedules\n{detail}", file=sys.stderr)
        c.write_results(f"{NAME}-{args.mode}", args, {"runs": len(rows), "ok": False})
        return 1
    done = [r for r in rows if r[2] is not None]
    lag = [(s - f).total_seconds() for f, _, s, _ in done]
    tick_lag = [(cr - f).total_seconds() for f, cr, _, _ in done]
    poll_lag = [(s - cr).total_seconds() for _, cr, s, _ in done]
    target = args.poll_interval + 0.05
    stats = {
        name: summarise(values)
        for name, values in (("start_lag", lag), ("tick_wait", tick_lag), ("worker_wait", poll_lag))
    }
    print(
        c.table(
            ["measure (s)", "runs", "p50", "p95", "p99", "max", "mean"],
            [[name, s["n"], s["p50"], s["p95"], s["p99"], s["max"], s["mean"]] for name, s in stats.items()],
        )
    )
    verdict = "meets" if stats["start_lag"]["p99"] <= target else "MISSES"
    print(
        f"p99 start lag {stats['start_lag']['p99'] * 1000:.0f} ms {verdict} the target <= {target * 1000:.0f} ms "
        f"(poll {args.poll_interval:.2f} s + 50 ms); {len(missing)} run(s) not succeeded in time"
    )
    c.write_results(
        f"{NAME}-{args.mode}",
        args,
        {
            "runs": len(rows),
            "not_succeeded": len(missing),
            "target_s": target,
            "stats": stats,
            "meets_target": verdict == "meets",
        },
    )
    return 0 if not missing else 1


def summarise(values: list[float]) -> dict:
    return {
        "n": len(values),
        "p50": c.percentile(values, 50),
        "p95": c.percentile(values, 95),
        "p99": c.percentile(values, 99),
        "max": max(values) if values else float("nan"),
        "mean": sum(values) / len(values) if values else float("nan"),
    }


if __name__ == "__main__":
    sys.exit(main())
