"""Chaos run on a scratch database: SIGKILL random workers while they drain real runs.

    .venv/bin/python bench/chaos.py --db sqlite --runs 3000 --workers 4
    .venv/bin/python bench/chaos.py --db postgres --runs 3000 --workers 4 --kill-every 1-2 --lease 2

The same harness as ``tests/chaos/test_chaos.py`` (see ``tests/chaos/harness.py``
for what is checked), with bigger knobs. It creates its own database (a
temporary SQLite file, or a ``distsched_chaos_<pid>`` PostgreSQL database that
it drops at the end), migrates it, runs the chaos, prints one summary line and
exits 1 if any invariant was broken.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PG_ADMIN_URL = os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432")


def kill_range(text: str) -> tuple[float, float]:
    try:
        low, _, high = text.partition("-")
        bounds = (float(low), float(high or low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give seconds, e.g. 1.5 or 1-2") from None
    if not 0 < bounds[0] <= bounds[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 < MIN <= MAX")
    return bounds


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    p.add_argument("--runs", type=int, default=3000, help="once schedules, one run each (default 3000)")
    p.add_argument(
        "--interval-schedules",
        type=int,
        default=4,
        help="one-second interval schedules running during the window (default 4)",
    )
    p.add_argument(
        "--window", type=float, default=None, help="seconds over which the once runs come due (default: runs / 25)"
    )
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--tickers", type=int, default=2)
    p.add_argument(
        "--kill-every",
        type=kill_range,
        default=(1.0, 2.0),
        metavar="MIN[-MAX]",
        help="seconds between SIGKILLs, uniform in [MIN, MAX] (default 1-2)",
    )
    p.add_argument("--lease", type=float, default=2.0, help="lease seconds (default 2)")
    p.add_argument("--heartbeat", type=float, default=0.5, help="heartbeat seconds (default 0.5)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds allowed to drain after the window")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--keep", action="store_true", help="keep the scratch database and the process logs")
    return p.parse_args()


def _pg_admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(f"{PG_ADMIN_URL}/postgres", autocommit=True) as conn:
        conn.execute(sql)


def main() -> int:
    args = parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="distsched-chaos-"))
    dbname = f"distsched_chaos_{os.getpid()}"
    if args.db == "sqlite":
        url = f"sqlite:///{scratch / 'chaos.sqlite3'}"
    else:
        _pg_admin(f'CREATE DATABASE "{dbname}"')
        url = f"{PG_ADMIN_URL}/{dbname}"
    os.environ.update(
        DATABASE_URL=url,
        DJANGO_SETTINGS_MODULE="tests.settings",
        DJANGO_DEBUG="0",
        DISTSCHED_LOG_LEVEL=os.environ.get("DISTSCHED_LOG_LEVEL", "WARNING"),
    )
    ok = False
    try:
        import django

        django.setup()
        from django.core.management import call_command

        from tests.chaos.harness import ChaosConfig, run_chaos

        call_command("migrate", verbosity=0)
        config = ChaosConfig(
            runs=args.runs,
            interval_schedules=args.interval_schedules,
            window=args.window if args.window is not None else max(10.0, args.runs / 25),
            workers=args.workers,
            tickers=args.tickers,
            kill_every=args.kill_every,
            lease=args.lease,
            heartbeat=args.heartbeat,
            timeout=args.timeout,
            seed=args.seed,
        )
        result = run_chaos(config, log_dir=scratch / "logs", say=lambda line: print(line, flush=True))
        for problem in result.problems:
            print(f"PROBLEM: {problem}")
        if result.problems:
            print(result.log_tails())
        print(result.summary(), flush=True)
        ok = not result.problems
    finally:
        from django.db import connections

        connections.close_all()
        if args.keep:
            print(f"kept: {url} (logs in {scratch / 'logs'})")
        else:
            if args.db == "postgres":
                _pg_admin(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
            shutil.rmtree(scratch, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
