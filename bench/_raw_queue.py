"""The raw SQL floor of ``bench/peers.py``: a job queue in a few statements, no framework.

    python bench/_raw_queue.py setup                # (re)create the table
    python bench/_raw_queue.py enqueue --count N    # N INSERTs, one transaction each; one JSON line
    python bench/_raw_queue.py work                 # claim + complete until nothing is left, then exit

The database is ``$DATABASE_URL`` (``sqlite:///path`` or ``postgres://...``), reached
through the driver itself (``sqlite3``, psycopg 3): no Django, no ORM. SQLite gets the
project's tuning (WAL, ``synchronous=NORMAL``, a 30 s busy timeout). The table is
``raw_jobs(id, state, payload, created_at, attempts, done_at)`` with a partial index on
the queued ids; ``created_at`` and ``done_at`` are the writer's ``time.time()``.

- **enqueue**: one ``INSERT`` per job in autocommit (its own transaction), each timed.
- **work**: per job, one claim transaction (PostgreSQL: ``UPDATE ... WHERE id = (SELECT id
  ... ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING``; SQLite: ``BEGIN IMMEDIATE``,
  ``SELECT``, ``UPDATE``, ``COMMIT``), the payload decoded and a no-op called, then one
  completion transaction (``UPDATE ... SET state = 'done'``). ``attempts`` counts the claims,
  so the benchmark can check every job ran exactly once.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import time

TABLE = "raw_jobs"
PAYLOAD = json.dumps({"task": "noop", "args": [], "kwargs": {}})


def connect():
    url = os.environ["DATABASE_URL"]
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(url[len("sqlite:///") :], timeout=30, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return "sqlite", conn
    import psycopg

    return "postgres", psycopg.connect(url.replace("postgres://", "postgresql://", 1), autocommit=True)


def setup() -> None:
    vendor, conn = connect()
    key = "INTEGER PRIMARY KEY AUTOINCREMENT" if vendor == "sqlite" else "bigserial PRIMARY KEY"
    real = "REAL" if vendor == "sqlite" else "double precision"
    conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
    conn.execute(
        f"CREATE TABLE {TABLE} (id {key}, state varchar(16) NOT NULL DEFAULT 'queued', payload text NOT NULL, "
        f"created_at {real} NOT NULL, attempts integer NOT NULL DEFAULT 0, done_at {real})"
    )
    conn.execute(f"CREATE INDEX {TABLE}_queued ON {TABLE} (id) WHERE state = 'queued'")
    conn.close()


def enqueue(count: int) -> None:
    vendor, conn = connect()
    mark = "?" if vendor == "sqlite" else "%s"
    sql = f"INSERT INTO {TABLE} (payload, created_at) VALUES ({mark}, {mark})"
    start = time.perf_counter()
    conn.execute(sql, (PAYLOAD, time.time()))  # warm-up, untimed
    first_ms = (time.perf_counter() - start) * 1000
    clock = time.perf_counter
    durations = []
    begin = clock()
    for _ in range(count - 1):
        t0 = clock()
        conn.execute(sql, (PAYLOAD, time.time()))
        durations.append(clock() - t0)
    seconds = clock() - begin
    conn.close()
    durations.sort()
    n = len(durations)
    middle = durations[n // 2] if n % 2 else (durations[n // 2 - 1] + durations[n // 2]) / 2
    print(
        json.dumps(
            {
                "system": "raw",
                "count": count,
                "timed": n,
                "seconds": seconds,
                "first_ms": first_ms,
                "median_ms": 1000 * middle,
                "p90_ms": 1000 * durations[min(n - 1, int(n * 0.9))],
                "mean_ms": 1000 * seconds / n,
                "per_s": n / seconds,
                "statements_per": 1.0,
                "connects_per": 0.0,
                "statement_kinds": {"INSERT": n},
            }
        )
    )


def noop() -> None:
    return None


def work() -> int:
    vendor, conn = connect()
    done = 0
    if vendor == "postgres":
        claim_sql = (
            f"UPDATE {TABLE} SET state = 'running', attempts = attempts + 1 WHERE id = "
            f"(SELECT id FROM {TABLE} WHERE state = 'queued' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) "
            "RETURNING id, payload"
        )
        done_sql = f"UPDATE {TABLE} SET state = 'done', done_at = %s WHERE id = %s"

        def claim():
            return conn.execute(claim_sql).fetchone()

        def complete(job_id: int) -> None:
            conn.execute(done_sql, (time.time(), job_id))
    else:
        select_sql = (
            f"SELECT id, payload FROM {TABLE} INDEXED BY {TABLE}_queued WHERE state = 'queued' ORDER BY id LIMIT 1"
        )
        running_sql = f"UPDATE {TABLE} SET state = 'running', attempts = attempts + 1 WHERE id = ?"
        done_sql = f"UPDATE {TABLE} SET state = 'done', done_at = ? WHERE id = ?"

        def claim():
            conn.execute("BEGIN IMMEDIATE")
            row = conn.execute(select_sql).fetchone()
            if row is not None:
                conn.execute(running_sql, (row[0],))
            conn.execute("COMMIT")
            return row

        def complete(job_id: int) -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(done_sql, (time.time(), job_id))
            conn.execute("COMMIT")

    while (row := claim()) is not None:
        job = json.loads(row[1])
        if job["task"] == "noop":
            noop(*job["args"], **job["kwargs"])
        complete(row[0])
        done += 1
    conn.close()
    print(f"raw worker {os.getpid()}: {done} jobs", flush=True)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("setup", "enqueue", "work"))
    p.add_argument("--count", type=int, default=0)
    args = p.parse_args()
    if args.mode == "setup":
        setup()
    elif args.mode == "enqueue":
        if args.count < 2:
            p.error("--count must be at least 2")
        enqueue(args.count)
    else:
        return work()
    return 0


if __name__ == "__main__":
    sys.exit(main())
