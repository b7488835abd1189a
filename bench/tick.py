"""Tick scaling: (a) one tick over many due interval schedules, (b) ticks over many idle schedules.

    .venv/bin/python bench/tick.py --db sqlite --due 10000 --idle 100000
    .venv/bin/python bench/tick.py --db postgres --due 10000 --idle 100000 --repeat 5

(a) ``--due`` interval schedules (every 60 s), all due once: one call of
``services.tick.tick(now=...)`` is timed; it must create one run (and one
``created`` event) per schedule. Repeated ``--repeat`` times after resetting
the runs and ``next_run_at``; min/median/max reported.

(b) ``--idle`` interval schedules whose ``next_run_at`` is in the future:
``--idle-ticks`` ticks are timed and the median is reported (the cost of a
ticker loop on a large, quiet installation).

Schedules are bulk-inserted with the exact field values ``create_schedule``
produces (one is validated through it, then cloned) and the tables ANALYZEd.
An extra untimed tick runs under Django's query capture to report how many
statements a tick issues and how much of its time is spent in the database.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta

import _common as c

NAME = "tick"


def main() -> int:
    p = c.parser(__doc__.splitlines()[0])
    p.add_argument("--due", type=int, default=10_000, help="Due interval schedules for (a).")
    p.add_argument("--idle", type=int, default=100_000, help="Not-due schedules for (b).")
    p.add_argument("--repeat", type=int, default=3, help="Timed ticks for (a).")
    p.add_argument("--idle-ticks", type=int, default=20, help="Timed ticks for (b).")
    p.add_argument("--profile", action="store_true", help="Also print a cProfile of one (a) tick.")
    p.add_argument("--profile-top", type=int, default=25)
    args = p.parse_args()
    with c.scratch_database(NAME, args):
        c.header("tick scaling", args)
        due = bench_due(args)
        idle = bench_idle(args)
        rows = [
            [
                f"(a) one tick, {args.due:,} due",
                args.repeat,
                due["min_s"] * 1000,
                due["median_s"] * 1000,
                due["max_s"] * 1000,
                due["queries"],
                due["db_share"] * 100,
                "<= 1000 ms",
            ],
            [
                f"(b) one tick, {args.idle:,} none due",
                args.idle_ticks,
                idle["min_s"] * 1000,
                idle["median_s"] * 1000,
                idle["max_s"] * 1000,
                idle["queries"],
                idle["db_share"] * 100,
                "<= 20 ms",
            ],
        ]
        print()
        print(c.table(["case", "n", "min ms", "median ms", "max ms", "queries", "db time %", "target"], rows))
        c.write_results(NAME, args, {"due": due, "idle": idle})
    return 0


def bench_due(args) -> dict:
    from django.db import connection, transaction

    from distsched_app.models import Run, RunEvent, Schedule
    from distsched_app.services.tick import tick

    base = c.now()
    slot = base - timedelta(seconds=30)

    def make(i: int) -> dict:
        return {"next_run_at": slot, "created_at": base - timedelta(hours=1), "updated_at": base}

    t0 = time.perf_counter()
    c.bulk_schedules("due", args.due, make, "interval")
    print(f"(a) inserted {args.due:,} due interval schedules in {time.perf_counter() - t0:.1f} s")
    c.analyze()

    def reset() -> None:
        with transaction.atomic():
            with connection.cursor() as cur:
                if connection.vendor == "postgresql":
                    # CASCADE: the tables that reference runs (limit holds, workflow nodes), empty here.
                    cur.execute("TRUNCATE distsched_app_runevent, distsched_app_run CASCADE")
                else:
                    cur.execute("DELETE FROM distsched_app_runevent")
                    cur.execute("DELETE FROM distsched_app_run")
            Schedule.objects.update(next_run_at=slot)
        c.analyze()

    times = []
    for rep in range(args.repeat):
        reset()
        tick_now = c.now()
        start = time.perf_counter()
        created = tick(now=tick_now)
        elapsed = time.perf_counter() - start
        times.append(elapsed)
        if len(created) != args.due or Run.objects.count() != args.due or RunEvent.objects.count() != args.due:
            raise SystemExit(f"(a) tick created {len(created)} runs, expected {args.due}")
        print(f"(a) rep {rep + 1}: {elapsed * 1000:.0f} ms for {len(created):,} runs")
    reset()
    queries, db_share, top = captured(lambda: tick(now=c.now()))
    print("(a) costliest statements of one tick (untimed run):")
    print(c.table(["statement", "count", "ms"], [[t["sql"], t["count"], t["ms"]] for t in top]))
    profile = ""
    if args.profile:
        reset()
        profile = profiled(lambda: tick(now=c.now()), args.profile_top)
        print(f"--- (a) one tick under cProfile, top {args.profile_top} by cumulative and internal time\n{profile}")
    return {
        "profile": profile,
        "top_statements": top,
        "times_s": times,
        "min_s": min(times),
        "median_s": c.median(times),
        "max_s": max(times),
        "queries": queries,
        "db_share": db_share,
    }


def bench_idle(args) -> dict:
    from django.db import connection

    from distsched_app.services.tick import tick

    with connection.cursor() as cur:
        cur.execute("DELETE FROM distsched_app_runevent")
        cur.execute("DELETE FROM distsched_app_run")
        cur.execute("DELETE FROM distsched_app_schedule")
    base = c.now()

    def make(i: int) -> dict:
        future = base + timedelta(hours=1, milliseconds=i)
        return {"next_run_at": future, "created_at": base, "updated_at": base}

    t0 = time.perf_counter()
    c.bulk_schedules("idle", args.idle, make, "interval")
    print(f"(b) inserted {args.idle:,} idle interval schedules in {time.perf_counter() - t0:.1f} s")
    c.analyze()
    tick(now=c.now())  # warm-up: connection, statement caches
    times = []
    for _ in range(args.idle_ticks):
        start = time.perf_counter()
        created = tick(now=c.now())
        times.append(time.perf_counter() - start)
        if created:
            raise SystemExit(f"(b) tick created {len(created)} runs; none was due")
    queries, db_share, _ = captured(lambda: tick(now=c.now()))
    print(f"(b) median {c.median(times) * 1000:.2f} ms over {len(times)} ticks")
    return {
        "times_s": times,
        "min_s": min(times),
        "median_s": c.median(times),
        "max_s": max(times),
        "p95_s": c.percentile(times, 95),
        "queries": queries,
        "db_share": db_share,
    }


def captured(fn) -> tuple[int, float, list[dict]]:
    """Statements issued, share of wall time spent executing them (Django's cursor
    and the server-side-binding ones), and the costliest statement shapes (first
    70 characters), for one untimed call."""
    from django.db import connection

    spent: dict[str, list[float]] = {}

    def timer(execute, sql, params, many, context):
        start = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            spent.setdefault(" ".join(sql.split())[:70], []).append(time.perf_counter() - start)

    # PostgreSQL's bulk statements bypass Django's cursor (db/bulk.py): time them too.
    from distsched_app.db import bulk

    pg_execute = bulk.server_side_execute

    def timed_pg_execute(sql, params, **kwargs):
        return timer(lambda s, p, m, ctx: pg_execute(s, p, **kwargs), sql, params, False, None)

    bulk.server_side_execute = timed_pg_execute
    try:
        with connection.execute_wrapper(timer):
            start = time.perf_counter()
            fn()
            elapsed = time.perf_counter() - start
    finally:
        bulk.server_side_execute = pg_execute
    total = sum(sum(v) for v in spent.values())
    top = sorted(({"sql": k, "count": len(v), "ms": sum(v) * 1000} for k, v in spent.items()), key=lambda d: -d["ms"])[
        :6
    ]
    return sum(len(v) for v in spent.values()), (total / elapsed if elapsed else 0.0), top


def profiled(fn, top: int) -> str:
    """cProfile one call; the top entries by internal time."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.runcall(fn)
    buf = io.StringIO()
    for key in ("cumulative", "tottime"):
        pstats.Stats(prof, stream=buf).strip_dirs().sort_stats(key).print_stats(top)
    return buf.getvalue()


if __name__ == "__main__":
    sys.exit(main())
