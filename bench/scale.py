"""Read paths at scale: 1M runs + 3M events, then API/admin/metrics latency and EXPLAIN of hot queries.

    .venv/bin/python bench/scale.py --db postgres                  # 1,000,000 runs, 3,000,000 events
    .venv/bin/python bench/scale.py --db sqlite --runs 200000

Loading is done in the database itself (PostgreSQL: ``INSERT ... SELECT`` over
``generate_series``; SQLite: a recursive CTE), followed by ``ANALYZE``. The
state mix is 90% succeeded, 3% dead, 3% pending, 2% retrying, 1% cancelled,
1% running, over ``--schedules`` interval schedules (5% paused), with slots
spread over the last 30 days, three events per run and ``kwargs`` ``{"account_id": g mod 1000}``
(so a kwargs search matches one run in 1,000). Then each endpoint is
requested ``--requests`` times through ``django.test.Client`` logged in as a
superuser (after 2 warm-up requests); an endpoint that does not exist yet is
reported as ``n/a (404)``. Finally the hot queries are captured as the code
issues them and EXPLAINed (PostgreSQL: ``EXPLAIN (ANALYZE, BUFFERS)``; SQLite:
``EXPLAIN QUERY PLAN``); the plans are also written to
``bench/results/explain-<db>.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import _common as c

NAME = "scale"
SPAN = timedelta(days=30)
ERROR_TEXT = (
    'ValueError: boom\n\nTraceback (most recent call last):\n  File "tasks.py", line 12, in fail\n'
    "    raise ValueError(message)\nValueError: boom"
)

ENDPOINTS = [
    # (label, url, target ms)
    ("GET /api/runs?state=dead", "/api/runs?state=dead", 50),
    ("GET /api/runs?state=dead (page 2)", None, 50),
    ("GET /api/runs", "/api/runs", 50),
    # Every list filter, with common, rare, unknown and idle values (issue 21: index-backed, <= 50 ms).
    ("GET /api/runs?schedule=scale-7", "/api/runs?schedule=scale-7", 50),
    ("GET /api/runs?schedule=scale-idle (no run)", "/api/runs?schedule=scale-idle", 50),
    ("GET /api/runs?schedule=nope (unknown)", "/api/runs?schedule=nope", 50),
    ("GET /api/runs?origin=manual (1 in 1,000)", "/api/runs?origin=manual", 50),
    ("GET /api/runs?origin=enqueued", "/api/runs?origin=enqueued", 50),
    ("GET /api/runs?task_name=tests.noop", "/api/runs?task_name=tests.noop", 50),
    ("GET /api/runs?task_name=tests.none (unknown)", "/api/runs?task_name=tests.none", 50),
    ("GET /api/runs?queue=emails", "/api/runs?queue=emails", 50),
    ("GET /api/runs?queue=nowhere (unknown)", "/api/runs?queue=nowhere", 50),
    ("GET /api/runs?priority=5 (none)", "/api/runs?priority=5", 50),
    ("GET /api/runs?state=cancelled", "/api/runs?state=cancelled", 50),
    ("admin runs ?state__exact=dead", "/admin/distsched_app/run/?state__exact=dead", 300),
    ("admin runs (unfiltered)", "/admin/distsched_app/run/", 300),
    ("admin runs ?schedule=scale-idle", "/admin/distsched_app/run/?schedule=scale-idle", 300),
    ("admin runs ?origin=manual", "/admin/distsched_app/run/?origin=manual", 300),
    ("admin runs ?queue=emails", "/admin/distsched_app/run/?queue=emails", 300),
    ("GET /api/stats", "/api/stats", 200),
    ("GET /metrics", "/metrics", 200),
    # The operators' pages (issue 20): the run list sorted by its time columns (o=-9: scheduled for,
    # o=-10: started; the list_display positions), a kwargs search (the last 24 hours by default),
    # the queues page and API, the dashboard (with the last hour's task timing).
    ("admin runs sorted by started (o=-10)", "/admin/distsched_app/run/?o=-10", 300),
    ("admin runs sorted by scheduled for (o=-9)", "/admin/distsched_app/run/?o=-9", 300),
    ("admin runs dead, sorted by started", "/admin/distsched_app/run/?state=dead&o=-10", 300),
    ("admin runs ?kwargs__account_id=42", "/admin/distsched_app/run/?kwargs__account_id=42", 300),
    ("GET /api/runs?kwargs__account_id=42", "/api/runs?kwargs__account_id=42", 50),
    ("GET /api/runs?kwargs__account_id=42&state=dead", "/api/runs?kwargs__account_id=42&state=dead", 50),
    ("GET /api/queues", "/api/queues", 50),
    ("admin queues page", "/admin/distsched_app/queuepause/queues/", 300),
    ("admin queue page (default)", "/admin/distsched_app/queuepause/queues/default/", 300),
    ("admin dashboard", "/admin/distsched_app/run/dashboard/", 200),
]

# Events per run: (second, third) event after ``created``, by final state.
EVENTS = {
    "succeeded": ("started", "succeeded"),
    "dead": ("failed", "marked_dead"),
    "retrying": ("failed", "retry_scheduled"),
    "pending": ("claimed", "lease_expired"),
    "cancelled": ("cancel_requested", "cancelled"),
    "running": ("claimed", "started"),
}


def main() -> int:
    p = c.parser(__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=1_000_000, help="Runs of history, spread over the last 30 days.")
    p.add_argument(
        "--busy-hour",
        type=int,
        default=0,
        help="Runs more that finished in the last hour (97%% succeeded, 3%% dead): a busy installation's "
        "throughput, which /metrics, /api/stats and the dashboard must not pay for.",
    )
    p.add_argument(
        "--database-url",
        help="Target this database (PostgreSQL, or sqlite:///PATH) instead of a scratch one (migrated, never "
        "dropped); with --reuse, "
        "a database that already holds runs is measured as it is (build 10M runs once, measure many times).",
    )
    p.add_argument("--reuse", action="store_true", help="With --database-url: do not load if runs are there.")
    p.add_argument(
        "--refresh-busy-hour",
        action="store_true",
        help="With --reuse: move the history's newest hour (the --busy-hour runs of the load, and their events) "
        "forward so that it ends a minute ago, then VACUUM ANALYZE: a database loaded hours ago still has a busy "
        "last hour. Nothing moves when it already ends within 5 minutes of now.",
    )
    p.add_argument(
        "--finish-backlog-older-than",
        metavar="DAYS",
        type=float,
        help="With --reuse: mark the loaded history's pending, retrying and running runs older than DAYS days "
        "succeeded (the load's mix leaves 5%% of 30 days unfinished), then VACUUM ANALYZE.",
    )
    p.add_argument("--load-only", action="store_true", help="Load (or reuse) and stop: no measurement.")
    p.add_argument(
        "--empty-url",
        help="A second database, without history, against which --claims are compared in the same run. "
        "Default on SQLite: a file beside the scratch database (sqlite:///PATH works on either side).",
    )
    p.add_argument(
        "--claims",
        type=int,
        default=0,
        help="Measure the 10,000-due tick and claim throughput/p99 with this many runs (0: skip), here and in "
        "--empty-url, alternating, --repeat times.",
    )
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument(
        "--prune-older-than",
        help="Last: run `distsched prune --older-than AGE` (e.g. 25d) while a claim loop measures p99, and "
        "compare with the same loop without prune. Deletes history from the database!",
    )
    p.add_argument(
        "--prune-batch-size", type=int, help="With --prune-older-than: the prune's --batch-size (default: its own)."
    )
    p.add_argument(
        "--prune-pause",
        type=float,
        help="With --prune-older-than: the prune's --pause (rest per batch, in times the batch took; 0: none).",
    )
    p.add_argument(
        "--prune-baseline-rounds",
        type=int,
        default=3,
        help="With --prune-older-than: claim rounds measured before the prune (their median p99 is the baseline) "
        "and again after it.",
    )
    p.add_argument("--no-endpoints", action="store_true")
    p.add_argument("--with-leader", action="store_true", help="Run a `tick --loop` leader while measuring.")
    p.add_argument("--claims-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(
        "--profile-tick",
        action="store_true",
        help="With --claims N (and --empty-url): where the tick of N due schedules spends its time, here and on "
        "the empty database: each statement timed, and EXPLAIN (ANALYZE, BUFFERS) of its inserts (run once in a "
        "savepoint, rolled back, before the real statement).",
    )
    p.add_argument("--profile-tick-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--schedules", type=int, default=1000)
    p.add_argument("--requests", type=int, default=30, help="Timed requests per endpoint.")
    p.add_argument("--no-explain", action="store_true")
    p.add_argument(
        "--keep-indexes",
        action="store_true",
        help="Load with the secondary indexes in place (slower) instead of rebuilding them after.",
    )
    p.add_argument(
        "--kwargs-index",
        action="store_true",
        help="Add the optional expression index on kwargs' account_id (docs/reference/rest.md) before measuring.",
    )
    args = p.parse_args()
    with _database(args):
        from distsched_app.models import Run

        if args.claims_child:
            print("RESULT " + json.dumps(claims_and_tick(args.claims)))
            return 0
        if args.profile_tick_child:
            print("RESULT " + json.dumps(profile_tick(args.claims)))
            return 0
        if args.reuse and Run.objects.exists():
            load = {"reused": True}
            if args.finish_backlog_older_than is not None:
                load["finished_backlog"] = finish_backlog(args.finish_backlog_older_than)
            if args.refresh_busy_hour:
                load["busy_hour_refresh"] = refresh_busy_hour()
            load["runs"] = c.states()
            args.runs = sum(load["runs"].values())
            c.header(f"scale: reusing {args.runs:,} runs", args)
        else:
            c.header(f"scale: {args.runs:,} runs + {args.busy_hour:,} in the last hour, 3 events each", args)
            load = load_data(args)
        if args.load_only:
            return 0
        if args.kwargs_index:
            add_kwargs_index()
        results: dict[str, Any] = {"load": load, "sizes": sizes()}
        if args.claims and args.profile_tick:
            results["tick_profile"] = compare_tick_profiles(args)
        elif args.claims:
            if args.empty_url is None and c.vendor() == "sqlite":
                args.empty_url = _empty_sqlite()
            results["claims"] = compare_claims(args)
        leader = _start_leader() if args.with_leader else None
        results["endpoints"] = [] if args.no_endpoints else measure_endpoints(args)
        results["figures"] = stored_figures()
        if leader is not None:
            c.stop_children()
        results["explain"] = [] if args.no_explain else explain_hot_queries(args)
        if args.prune_older_than:
            results["prune"] = prune_under_claims(args)
            results["sizes_after_prune"] = sizes()
        c.write_results(NAME, args, results)
    return 0


def _database(args):
    """A scratch database, or the one ``--database-url`` names (created if missing, migrated, kept)."""
    if not args.database_url:
        return c.scratch_database(NAME, args)
    args.db = "sqlite" if args.database_url.startswith("sqlite:") else "postgres"  # the results file's name
    return c.existing_database(args.database_url, args)


# -- keeping a kept database honest --------------------------------------------


def refresh_busy_hour() -> dict[str, Any]:
    """Shift the newest hour of history (runs finished within the hour before the newest finish,
    and their events) by the time since, so that it ends a minute ago again (PostgreSQL)."""
    from django.db import connection

    start = time.perf_counter()
    with connection.cursor() as cur:
        cur.execute(
            "SELECT max(finished_at) FROM distsched_app_run WHERE finished_at IS NOT NULL AND queue <> %s",
            [CLAIM_QUEUE],
        )
        (last,) = cur.fetchone()
        if last is None:
            return {"moved_runs": 0}
        shift = c.now() - timedelta(minutes=1) - last
        if shift < timedelta(minutes=5):
            print(f"busy hour: it ends {shift + timedelta(minutes=1)} ago; not moved")
            return {"moved_runs": 0, "ends_ago_s": (shift + timedelta(minutes=1)).total_seconds()}
        cur.execute(
            """
            WITH moved AS (
                UPDATE distsched_app_run SET scheduled_for = scheduled_for + %(shift)s,
                    available_at = available_at + %(shift)s, started_at = started_at + %(shift)s,
                    finished_at = finished_at + %(shift)s, created_at = created_at + %(shift)s,
                    updated_at = updated_at + %(shift)s
                WHERE finished_at > %(last)s::timestamptz - interval '1 hour' AND queue <> %(queue)s
                RETURNING id)
            SELECT count(*), min(id), max(id) FROM moved
            """,
            {"shift": shift, "last": last, "queue": CLAIM_QUEUE},
        )
        runs, low, high = cur.fetchone()
        cur.execute(
            """
            UPDATE distsched_app_runevent e SET created_at = e.created_at + %(shift)s
            FROM distsched_app_run r
            WHERE e.run_id = r.id AND r.id BETWEEN %(low)s AND %(high)s
              AND r.finished_at > %(last)s::timestamptz - interval '1 hour' + %(shift)s
            """,
            {"shift": shift, "low": low, "high": high, "last": last},
        )
        events = cur.rowcount
    moved = time.perf_counter() - start
    vacuum = _vacuum_analyze()
    print(
        f"busy hour moved forward by {shift}: {runs:,} runs and {events:,} events in {moved:.1f} s "
        f"(+ VACUUM ANALYZE {vacuum:.1f} s)"
    )
    return {"moved_runs": runs, "moved_events": events, "shift_s": shift.total_seconds(), "seconds": moved}


def finish_backlog(days: float) -> dict[str, Any]:
    """The loaded history's unfinished runs older than ``days`` days, marked succeeded (PostgreSQL)."""
    from django.db import connection

    start = time.perf_counter()
    with connection.cursor() as cur:
        cur.execute(
            """
            UPDATE distsched_app_run SET state = 'succeeded', lease_owner = '', lease_expires_at = NULL,
                started_at = COALESCE(started_at, scheduled_for + interval '10 milliseconds'),
                finished_at = scheduled_for + interval '50 milliseconds', attempts = GREATEST(attempts, 1),
                last_error = ''
            WHERE state IN ('pending', 'retrying', 'running') AND scheduled_for < now() - %s * interval '1 day'
              AND queue <> %s
            """,
            [days, CLAIM_QUEUE],
        )
        runs = cur.rowcount
    seconds = time.perf_counter() - start
    vacuum = _vacuum_analyze()
    print(
        f"backlog older than {days:g} days finished: {runs:,} runs in {seconds:.1f} s",
        f"(+ VACUUM ANALYZE {vacuum:.1f} s)",
    )
    return {"runs": runs, "seconds": seconds, "vacuum_s": vacuum}


def _vacuum_analyze() -> float:
    from django.db import connection

    start = time.perf_counter()
    with connection.cursor() as cur:  # autocommit outside atomic(): VACUUM may run
        cur.execute("VACUUM (ANALYZE) distsched_app_run")
        cur.execute("VACUUM (ANALYZE) distsched_app_runevent")
    return time.perf_counter() - start


# -- loading -------------------------------------------------------------------


def _state_case(column: str) -> str:
    """90% succeeded, 3% dead, 2% retrying, 3% pending, 1% cancelled, 1% running (by ``column`` mod 100)."""
    return (
        f"CASE WHEN mod({column}, 100) < 90 THEN 'succeeded' WHEN mod({column}, 100) < 93 THEN 'dead' "
        f"WHEN mod({column}, 100) < 95 THEN 'retrying' WHEN mod({column}, 100) < 98 THEN 'pending' "
        f"WHEN mod({column}, 100) < 99 THEN 'cancelled' ELSE 'running' END"
    )


def _origin_case(column: str) -> str:
    """1 run in 50 enqueued (no schedule), 1 in 1,000 manual (a trigger), the rest made by the tick."""
    return (
        f"CASE WHEN mod({column}, 50) = 7 THEN 'enqueued' WHEN mod({column}, 1000) = 3 THEN 'manual' "
        "ELSE 'schedule' END"
    )


def _event_case(position: int) -> str:
    whens = " ".join(f"WHEN '{state}' THEN '{pair[position]}'" for state, pair in EVENTS.items())
    return f"CASE r.state {whens} END"


def load_data(args) -> dict[str, Any]:
    from django.db import connection

    connection.ensure_connection()
    loader = _load_postgres if connection.vendor == "postgresql" else _load_sqlite
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    loader(args, timings)
    start = time.perf_counter()
    c.analyze()
    timings["analyze_s"] = time.perf_counter() - start
    timings["total_s"] = time.perf_counter() - t0
    states = c.states()
    from distsched_app.models import RunEvent

    events = RunEvent.objects.count()
    print(
        f"loaded {sum(states.values()):,} runs, {events:,} events in {timings['total_s']:.1f} s "
        f"({', '.join(f'{k} {v:.1f}s' for k, v in timings.items() if k != 'total_s')})"
    )
    print("states: " + ", ".join(f"{k} {v:,}" for k, v in sorted(states.items(), key=lambda kv: -kv[1])))
    return {"timings": timings, "states": states, "events": events}


def _load_postgres(args, timings: dict[str, float]) -> None:
    from django.db import connection

    now = c.now()
    t0 = now - SPAN
    step_us = int(SPAN.total_seconds() * 1e6 / args.runs)
    raw = connection.connection  # psycopg connection: plain %(name)s parameters
    params = {
        "now": now,
        "t0": t0,
        "n": args.runs,
        "s": args.schedules,
        "step": step_us,
        "b": args.busy_hour,
        # the busy hour's slots end a minute ago: every one of its runs has finished
        "bstep": int(3540 * 1e6 / max(args.busy_hour, 1)),
        "err": ERROR_TEXT,
        "msg": "ValueError: boom",
    }
    with raw.cursor() as cur:
        cur.execute("SET synchronous_commit = off")
        cur.execute("SET maintenance_work_mem = '256MB'")
        # Bulk-load speed: no FK triggers (the rows are consistent by construction) and the
        # secondary indexes of the two big tables rebuilt once at the end (same definitions).
        cur.execute("SET session_replication_role = replica")
        cur.execute(
            """
            SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid) FROM pg_index i
            WHERE i.indrelid IN ('distsched_app_run'::regclass, 'distsched_app_runevent'::regclass)
              AND NOT i.indisprimary
              AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid)
            """
        )
        indexes = [] if args.keep_indexes else cur.fetchall()
        for name, _ in indexes:
            cur.execute(f"DROP INDEX {name}")
        start = time.perf_counter()
        cur.execute(
            """
            INSERT INTO distsched_app_schedule (name, task_name, args, kwargs, kind, interval_seconds, cron,
                timezone, run_at, start_at, next_run_at, paused, max_attempts, retry_base_seconds,
                retry_max_seconds, retry_jitter, catch_up, overlap, queue, created_at, updated_at)
            SELECT 'scale-' || g, 'tests.noop', '[]', '{}', 'interval', 60, '', 'UTC', NULL, NULL,
                   %(now)s::timestamptz + interval '10 minutes' + mod(g, 600) * interval '1 second',
                   mod(g, 20) = 0, 3, 10, 3600, 0, 'one', 'allow', 'default', %(t0)s, %(t0)s
            FROM generate_series(1, %(s)s) g
            """,
            params,
        )
        cur.execute("SELECT min(id) FROM distsched_app_schedule")
        params["sid0"] = cur.fetchone()[0]
        cur.execute(
            f"""
            INSERT INTO distsched_app_run (schedule_id, task_name, args, kwargs, state, scheduled_for,
                available_at, attempts, max_attempts, lease_owner, lease_expires_at, started_at, finished_at,
                last_error, result, queue, origin, idempotency_key, cancel_requested, created_at, updated_at)
            SELECT CASE WHEN o = 'enqueued' THEN NULL ELSE %(sid0)s + mod(g, %(s)s) END, 'tests.noop', '[]',
                   ('{{"account_id": ' || mod(g, 1000) || '}}')::jsonb, st, sf,
                   CASE st WHEN 'retrying' THEN sf + interval '10 minutes' ELSE sf END,
                   CASE st WHEN 'dead' THEN 3 WHEN 'pending' THEN 0 WHEN 'cancelled' THEN 0 ELSE 1 END, 3,
                   CASE st WHEN 'running' THEN 'bench-worker' ELSE '' END,
                   CASE st WHEN 'running' THEN %(now)s::timestamptz + interval '1 day' END,
                   CASE WHEN st IN ('succeeded', 'dead', 'retrying', 'running')
                        THEN sf + interval '10 milliseconds' END,
                   CASE WHEN st IN ('succeeded', 'dead', 'cancelled') THEN sf + interval '50 milliseconds' END,
                   CASE WHEN st IN ('dead', 'retrying') THEN %(err)s ELSE '' END,
                   NULL, CASE WHEN mod(g, 10) = 0 THEN 'emails' ELSE 'default' END, o,
                   'scale-' || mod(g, %(s)s) || ':' || g, false, sf,
                   sf + interval '50 milliseconds'
            FROM (SELECT g, CASE WHEN g > %(n)s THEN CASE WHEN mod(g, 100) < 97 THEN 'succeeded' ELSE 'dead' END
                                 ELSE {_state_case("g")} END AS st,
                         CASE WHEN g > %(n)s
                              THEN %(now)s::timestamptz - interval '1 hour'
                                   + ((g - %(n)s)::bigint * %(bstep)s) * interval '1 microsecond'
                              ELSE %(t0)s::timestamptz + (g::bigint * %(step)s) * interval '1 microsecond' END AS sf,
                         {_origin_case("g")} AS o
                  FROM generate_series(1, %(n)s + %(b)s) g) s
            """,
            params,
        )
        timings["runs_s"] = time.perf_counter() - start
        start = time.perf_counter()
        cur.execute(
            f"""
            INSERT INTO distsched_app_runevent (run_id, event_type, message, worker_id, attempt, created_at)
            SELECT r.id,
                   CASE k WHEN 0 THEN 'created' WHEN 1 THEN {_event_case(0)} ELSE {_event_case(1)} END,
                   CASE WHEN k > 0 AND r.state IN ('dead', 'retrying') THEN %(msg)s ELSE '' END,
                   CASE WHEN k > 0 THEN 'bench-worker' ELSE '' END,
                   CASE WHEN k > 0 THEN r.attempts ELSE 0 END,
                   r.scheduled_for + k * interval '10 milliseconds'
            FROM distsched_app_run r CROSS JOIN generate_series(0, 2) k
            ORDER BY r.id, k
            """,
            params,
        )
        timings["events_s"] = time.perf_counter() - start
        start = time.perf_counter()
        for _, definition in indexes:
            cur.execute(definition)
        timings["indexes_s"] = time.perf_counter() - start
        cur.execute("SET session_replication_role = DEFAULT")
        start = time.perf_counter()
        # A table this old has been vacuumed by autovacuum: set the visibility map too,
        # so that index-only scans are planned as they would be in production.
        cur.execute("VACUUM distsched_app_run")
        cur.execute("VACUUM distsched_app_runevent")
        timings["vacuum_s"] = time.perf_counter() - start
    if not raw.autocommit:
        raw.commit()


def _load_sqlite(args, timings: dict[str, float]) -> None:
    from django.db import connection

    now = c.now()
    t0 = now - SPAN
    fmt = "%Y-%m-%d %H:%M:%f"

    def ts(expr: str) -> str:
        return f"strftime('{fmt}', {expr})"

    day = 86400.0
    params = {
        "now": now.strftime("%Y-%m-%d %H:%M:%S"),
        "t0": t0.strftime("%Y-%m-%d %H:%M:%S"),
        "n": args.runs,
        "s": args.schedules,
        "step": SPAN.total_seconds() / args.runs / day,
        "b": args.busy_hour,
        "bstep": 3540 / max(args.busy_hour, 1) / day,  # the busy hour's slots end a minute ago
        "err": ERROR_TEXT,
        "msg": "ValueError: boom",
    }
    raw = connection.connection  # sqlite3 connection: plain :name parameters
    raw.execute("PRAGMA synchronous = OFF")
    raw.execute("PRAGMA cache_size = -400000")
    raw.execute("PRAGMA temp_store = MEMORY")
    ms = 1 / 86400000
    indexes = raw.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL "
        "AND tbl_name IN ('distsched_app_run', 'distsched_app_runevent')"
    ).fetchall()
    if args.keep_indexes:
        indexes = []
    for name, _ in indexes:
        raw.execute(f'DROP INDEX "{name}"')
    start = time.perf_counter()
    raw.execute("BEGIN")
    raw.execute(
        f"""
        WITH RECURSIVE seq(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM seq WHERE g < :s)
        INSERT INTO distsched_app_schedule (name, task_name, args, kwargs, kind, interval_seconds, cron,
            timezone, run_at, start_at, next_run_at, paused, max_attempts, retry_base_seconds,
            retry_max_seconds, retry_jitter, catch_up, overlap, queue, created_at, updated_at)
        SELECT 'scale-' || g, 'tests.noop', '[]', '{{}}', 'interval', 60, '', 'UTC', NULL, NULL,
               {ts("julianday(:now) + (600 + g % 600) / 86400.0")}, g % 20 = 0, 3, 10, 3600, 0, 'one', 'allow',
               'default', :t0, :t0
        FROM seq
        """,
        params,
    )
    params["sid0"] = raw.execute("SELECT min(id) FROM distsched_app_schedule").fetchone()[0]
    raw.execute(
        f"""
        WITH RECURSIVE seq(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM seq WHERE g < :n + :b)
        INSERT INTO distsched_app_run (schedule_id, task_name, args, kwargs, state, scheduled_for,
            available_at, attempts, max_attempts, lease_owner, lease_expires_at, started_at, finished_at,
            last_error, result, queue, origin, idempotency_key, cancel_requested, created_at, updated_at)
        SELECT CASE WHEN o = 'enqueued' THEN NULL ELSE :sid0 + g % :s END, 'tests.noop', '[]',
               '{{"account_id": ' || (g % 1000) || '}}', st, {ts("jf")},
               {ts(f"CASE st WHEN 'retrying' THEN jf + 600 * {ms * 1000} ELSE jf END")},
               CASE st WHEN 'dead' THEN 3 WHEN 'pending' THEN 0 WHEN 'cancelled' THEN 0 ELSE 1 END, 3,
               CASE st WHEN 'running' THEN 'bench-worker' ELSE '' END,
               CASE st WHEN 'running' THEN {ts("julianday(:now) + 1")} END,
               CASE WHEN st IN ('succeeded', 'dead', 'retrying', 'running') THEN {ts(f"jf + 10 * {ms}")} END,
               CASE WHEN st IN ('succeeded', 'dead', 'cancelled') THEN {ts(f"jf + 50 * {ms}")} END,
               CASE WHEN st IN ('dead', 'retrying') THEN :err ELSE '' END,
               NULL, CASE WHEN g % 10 = 0 THEN 'emails' ELSE 'default' END, o,
               'scale-' || (g % :s) || ':' || g, 0, {ts("jf")}, {ts(f"jf + 50 * {ms}")}
        FROM (SELECT g,
                     CASE WHEN g > :n THEN CASE WHEN g % 100 < 97 THEN 'succeeded' ELSE 'dead' END
                          ELSE {_state_case("g").replace("mod(g, 100)", "(g % 100)")} END AS st,
                     CASE WHEN g > :n THEN julianday(:now) - 1 / 24.0 + (g - :n) * :bstep
                          ELSE julianday(:t0) + g * :step END AS jf,
                     {_origin_case("g").replace("mod(g, 50)", "(g % 50)").replace("mod(g, 1000)", "(g % 1000)")} AS o
              FROM seq)
        """,
        params,
    )
    raw.execute("COMMIT")
    timings["runs_s"] = time.perf_counter() - start
    start = time.perf_counter()
    raw.execute("BEGIN")
    raw.execute(
        f"""
        INSERT INTO distsched_app_runevent (run_id, event_type, message, worker_id, attempt, created_at)
        SELECT r.id,
               CASE k.k WHEN 0 THEN 'created' WHEN 1 THEN {_event_case(0)} ELSE {_event_case(1)} END,
               CASE WHEN k.k > 0 AND r.state IN ('dead', 'retrying') THEN :msg ELSE '' END,
               CASE WHEN k.k > 0 THEN 'bench-worker' ELSE '' END,
               CASE WHEN k.k > 0 THEN r.attempts ELSE 0 END,
               {ts(f"julianday(r.scheduled_for) + k.k * 10 * {ms}")}
        FROM distsched_app_run r CROSS JOIN (SELECT 0 AS k UNION ALL SELECT 1 UNION ALL SELECT 2) k
        ORDER BY r.id, k.k
        """,
        params,
    )
    raw.execute("COMMIT")
    timings["events_s"] = time.perf_counter() - start
    start = time.perf_counter()
    for _, definition in indexes:
        raw.execute(definition)
    timings["indexes_s"] = time.perf_counter() - start
    raw.execute("PRAGMA synchronous = NORMAL")


def add_kwargs_index() -> None:
    """The expression index on one kwarg that docs/reference/rest.md suggests for a key searched often."""
    from django.db import connection

    expression = (
        "(kwargs -> 'account_id')" if connection.vendor == "postgresql" else "json_extract(kwargs, '$.\"account_id\"')"
    )
    start = time.perf_counter()
    with connection.cursor() as cur:
        cur.execute(f"CREATE INDEX kwargs_account_id_idx ON distsched_app_run ({expression})")
        cur.execute("ANALYZE distsched_app_run" if connection.vendor == "postgresql" else "ANALYZE")
    print(f"expression index on kwargs' account_id built in {time.perf_counter() - start:.1f} s")


# -- claims, the tick, prune ---------------------------------------------------

CLAIM_QUEUE = "bench-claims"


def claims_and_tick(count: int, *, prefix: str = "bench-due") -> dict[str, float]:
    """The tick of ``count`` due once-schedules (their own queue), then claim + succeed them all in
    batches of 32 (claim throughput, p99 of one claim transaction); everything removed after."""
    from distsched_app.services import claiming, outcomes
    from distsched_app.services.tick import tick

    base = c.now() - timedelta(seconds=5)

    def make(i: int) -> dict[str, Any]:
        slot = base + timedelta(microseconds=i)
        return {"run_at": slot, "next_run_at": slot, "created_at": base, "updated_at": base, "queue": CLAIM_QUEUE}

    _cleanup_claims(prefix)
    c.bulk_schedules(prefix, count, make, "once")
    start = time.perf_counter()
    created = tick(now=c.now())
    tick_s = time.perf_counter() - start
    claim_ms: list[float] = []
    done = 0
    start = time.perf_counter()
    while True:
        t = time.perf_counter()
        runs = claiming.claim_runs(
            worker_id="bench-claims", queues=[CLAIM_QUEUE], lease_seconds=60, now=c.now(), limit=32, start_all=True
        )
        claim_ms.append((time.perf_counter() - t) * 1000)
        if not runs:
            break
        finished = c.now()
        outcomes.record_successes(
            worker_id="bench-claims",
            now=finished,
            successes=[
                outcomes.Success(
                    run_id=r.pk, attempt=r.attempts, started_at=r.started_at or finished, finished_at=finished
                )
                for r in runs
            ],
        )
        done += len(runs)
    elapsed = time.perf_counter() - start
    _cleanup_claims(prefix)
    return {
        "tick_runs": len(created),
        "tick_s": tick_s,
        "claimed": done,
        "claims_per_s": done / elapsed,
        "claim_p50_ms": c.percentile(claim_ms, 50),
        "claim_p99_ms": c.percentile(claim_ms, 99),
    }


def _cleanup_claims(prefix: str) -> None:
    from django.db import transaction

    from distsched_app.models import Run, RunEvent, Schedule

    with transaction.atomic():
        RunEvent.objects.filter(run__queue=CLAIM_QUEUE).delete()
        Run.objects.filter(queue=CLAIM_QUEUE)._raw_delete(Run.objects.db)
        Schedule.objects.filter(name__startswith=f"{prefix}-")._raw_delete(Schedule.objects.db)


def profile_tick(count: int, *, prefix: str = "bench-due") -> dict[str, Any]:
    """The tick of ``count`` due once-schedules with each statement timed; each INSERT is first run
    as ``EXPLAIN (ANALYZE, BUFFERS)`` in a savepoint that is rolled back (so the real statement runs
    warm: its time is the lower bound, the plan's the cold one)."""
    from django.db import connection

    from distsched_app.db import bulk
    from distsched_app.services.tick import tick

    base = c.now() - timedelta(seconds=5)

    def make(i: int) -> dict[str, Any]:
        slot = base + timedelta(microseconds=i)
        return {"run_at": slot, "next_run_at": slot, "created_at": base, "updated_at": base, "queue": CLAIM_QUEUE}

    statements: list[dict[str, Any]] = []

    def explain_first(sql: str, params: Any, server_side: bool) -> str | None:
        if not sql.lstrip().upper().startswith(("INSERT", "WITH")):
            return None
        import psycopg

        raw = connection.connection
        with psycopg.Cursor(raw) if server_side else raw.cursor() as cur:
            cur.execute("SAVEPOINT profile")
            cur.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the deferred foreign-key checks, in the plan
            cur.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql, params)
            explained = "\n".join(row[0] for row in cur.fetchall())
            cur.execute("ROLLBACK TO SAVEPOINT profile")
            cur.execute("SET CONSTRAINTS ALL DEFERRED")  # Django's foreign keys: initially deferred
        return explained

    def record(sql: str, started: float, plan: str | None) -> None:
        ms = (time.perf_counter() - started) * 1000
        statements.append({"sql": " ".join(sql.split())[:90], "ms": ms, "plan": plan})

    def timer(execute, sql, params, many, context):
        plan = None if many else explain_first(sql, params, server_side=False)
        start = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            record(sql, start, plan)

    original = bulk.server_side_execute

    def server_side(sql: str, params: Any, *, last: bool = False) -> list[tuple]:
        plan = explain_first(sql, params, server_side=True)
        start = time.perf_counter()
        try:
            return original(sql, params, last=last)
        finally:
            record(sql, start, plan)

    _cleanup_claims(prefix)
    c.bulk_schedules(prefix, count, make, "once")
    with connection.cursor() as cur:
        cur.execute("SET track_io_timing = on")  # a session setting: the plans' I/O times
    start = time.perf_counter()
    bulk.server_side_execute = server_side
    try:
        with connection.execute_wrapper(timer):
            created = tick(now=c.now())
    finally:
        bulk.server_side_execute = original
    tick_s = time.perf_counter() - start
    _cleanup_claims(prefix)
    return {"tick_runs": len(created), "tick_s": tick_s, "statements": statements}


def compare_tick_profiles(args) -> dict[str, Any]:
    """``profile_tick`` here and on --empty-url, alternating, --repeat times; prints the statements side by side."""
    here = os.environ["DATABASE_URL"]
    if not args.empty_url:
        raise SystemExit("--profile-tick needs --empty-url (the empty database to compare with)")
    rows: dict[str, list[dict[str, Any]]] = {"big": [], "empty": []}
    for _ in range(args.repeat):
        rows["big"].append(_child(here, args.claims, flag="--profile-tick-child"))
        rows["empty"].append(_child(args.empty_url, args.claims, flag="--profile-tick-child"))
    for key in ("empty", "big"):
        for i, run in enumerate(rows[key]):
            head = f"tick profile, {key} database, round {i + 1}"
            print(f"\n== {head}: {run['tick_s']:.3f} s for {run['tick_runs']:,} runs")
            for st in run["statements"]:
                print(f"{st['ms']:9.1f} ms  {st['sql']}")
                if st["plan"] and i == len(rows[key]) - 1:
                    print("    " + st["plan"].replace("\n", "\n    "))
    return rows


def _child(url: str, count: int, *, flag: str = "--claims-child") -> dict[str, Any]:
    """``claims_and_tick`` (or ``flag``'s work) in a fresh process on ``url`` (each database its own Django set-up).
    Its PostgreSQL sessions are named ``bench-claims`` (``PGAPPNAME``) for the prune's wait sampler."""
    cmd = [sys.executable, __file__, "--database-url", url, "--reuse", "--runs", "0", flag]
    cmd += ["--claims", str(count)]
    env = dict(os.environ, DATABASE_URL=url, PGAPPNAME="bench-claims")
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    line = next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def _empty_sqlite() -> str:
    """A SQLite file without history beside the scratch database (removed with its folder)."""
    folder = c.scratch_dir(NAME)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "empty.sqlite3"
    path.unlink(missing_ok=True)
    return f"sqlite:///{path}"


def compare_claims(args) -> dict[str, Any]:
    """The same claims and tick here and on --empty-url (emptied), alternating, medians of --repeat."""
    here = os.environ["DATABASE_URL"]
    if not args.empty_url:
        raise SystemExit("--claims needs --empty-url (the empty database to compare with)")
    rows: dict[str, list[dict[str, float]]] = {"big": [], "empty": []}
    for _ in range(args.repeat):
        rows["big"].append(_child(here, args.claims))
        rows["empty"].append(_child(args.empty_url, args.claims))
    out: dict[str, Any] = {"runs": rows}
    table = []
    for key in ("tick_s", "claims_per_s", "claim_p50_ms", "claim_p99_ms"):
        big, empty = (c.median([r[key] for r in rows[k]]) for k in ("big", "empty"))
        out[key] = {"big": big, "empty": empty, "ratio": big / empty if empty else None}
        table.append([key, f"{empty:.3f}", f"{big:.3f}", f"x{big / empty:.2f}" if empty else "-"])
    print()
    print(f"tick of {args.claims:,} due schedules, claim + succeed of its runs (medians of {args.repeat}):")
    print(c.table(["figure", "empty database", "this database", "ratio"], table))
    return out


def prune_under_claims(args) -> dict[str, Any]:
    """Claim p99 without and during `distsched prune --older-than AGE`, and prune's rate."""
    from distsched_app.models import Run, RunEvent

    runs_before, events_before = Run.objects.count(), RunEvent.objects.count()
    url = os.environ["DATABASE_URL"]
    rounds = [_child(url, args.claims or 5000) for _ in range(args.prune_baseline_rounds)]
    baseline = {key: c.median([r[key] for r in rounds]) for key in ("claim_p99_ms", "claims_per_s")}
    log = c.scratch_dir(NAME) / "prune.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    sampler = WaitSampler(url) if c.vendor() == "postgresql" else None
    start = time.perf_counter()
    command = ["distsched", "prune", "--older-than", args.prune_older_than]
    if args.prune_batch_size:
        command += ["--batch-size", str(args.prune_batch_size)]
    if args.prune_pause is not None:
        command += ["--pause", str(args.prune_pause)]
    proc = c.spawn(command, log, env={"PGAPPNAME": "bench-prune"})
    during = []
    while proc.poll() is None:
        at = time.perf_counter() - start
        during.append(dict(_child(url, args.claims or 5000), at_s=at))
    elapsed = time.perf_counter() - start
    waits = sampler.stop() if sampler is not None else {}
    # The same rounds once the prune is done: with autovacuum off the rounds' own dead rows (each
    # round inserts and deletes 5,000 runs) slow the claims as the rounds go on, prune or not.
    after = [_child(url, args.claims or 5000) for _ in range(args.prune_baseline_rounds)]
    runs_after, events_after = Run.objects.count(), RunEvent.objects.count()
    deleted = (runs_before - runs_after) + (events_before - events_after)
    p99_during = c.median([d["claim_p99_ms"] for d in during]) if during else None
    print()
    print(
        "claim rounds without a prune (p99 ms): " + ", ".join(f"{r['claim_p99_ms']:.1f}" for r in rounds) + "; "
        "during it (started at s: p99 ms, claims/s):"
    )
    print("  " + "; ".join(f"{d['at_s']:.0f}: {d['claim_p99_ms']:.1f}, {d['claims_per_s']:,.0f}" for d in during))
    print("claim rounds after it (p99 ms): " + ", ".join(f"{r['claim_p99_ms']:.1f}" for r in after))
    if waits:
        print(c.table(["sampled every 0.1 s", "what it waited for", "share of samples"], waits["table"]))
        print(waits["summary"])
    out = {
        "older_than": args.prune_older_than,
        "batch_size": args.prune_batch_size,
        "pause": args.prune_pause,
        "runs_deleted": runs_before - runs_after,
        "events_deleted": events_before - events_after,
        "seconds": elapsed,
        "rows_per_s": deleted / elapsed,
        "claim_p99_ms_without": baseline["claim_p99_ms"],
        "claim_rounds_without": rounds,
        "claim_rounds": during,
        "claim_rounds_after": after,
        "claim_p99_ms_after": c.median([r["claim_p99_ms"] for r in after]) if after else None,
        "waits": waits,
        "claim_p99_ms_during": p99_during,
        "claim_rounds_during": len(during),
        "claims_per_s_without": baseline["claims_per_s"],
        "claims_per_s_during": c.median([d["claims_per_s"] for d in during]) if during else None,
        "prune_output": c.tail(log, 5),
    }
    print()
    print(
        f"prune --older-than {args.prune_older_than} (pause {args.prune_pause}): {out['runs_deleted']:,} runs + "
        f"{out['events_deleted']:,} events "
        f"in {elapsed:.1f} s = {out['rows_per_s']:,.0f} rows/s; claim p99 {baseline['claim_p99_ms']:.1f} ms without, "
        f"{'n/a' if p99_during is None else f'{p99_during:.1f}'} ms during ({len(during)} rounds)"
    )
    return out


class WaitSampler:
    """What the claims' and the prune's sessions wait for, sampled every 0.1 s from ``pg_stat_activity``
    on a connection of its own (a thread), with the checkpoints and WAL written meanwhile."""

    def __init__(self, url: str) -> None:
        import threading

        import psycopg

        self.conn = psycopg.connect(url, autocommit=True, application_name="bench-sampler")
        self.counts: dict[tuple[str, str], int] = {}
        self.samples: dict[str, int] = {}
        self.checkpoint_at: list[int] = []
        self.before = self._server()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _server(self) -> tuple[int, int, int]:
        row = self.conn.execute(
            "SELECT checkpoints_timed, checkpoints_req, pg_current_wal_lsn() - '0/0' FROM pg_stat_bgwriter"
        ).fetchone()
        return int(row[0]), int(row[1]), int(row[2])

    def _run(self) -> None:
        ticks, last = 0, self.before
        started = time.perf_counter()
        while not self.done.wait(0.1):
            ticks += 1
            if ticks % 10 == 0:  # a checkpoint's start, to the second (the counters move when one begins)
                now = self._server()
                if now[:2] != last[:2]:
                    self.checkpoint_at.append(round(time.perf_counter() - started))
                last = now
            rows = self.conn.execute(
                "SELECT application_name, state, wait_event_type, wait_event FROM pg_stat_activity "
                "WHERE application_name IN ('bench-claims', 'bench-prune')"
            ).fetchall()
            for app, state, kind, event in rows:
                self.samples[app] = self.samples.get(app, 0) + 1
                what = "idle (client side)" if state != "active" else f"{kind}:{event}" if kind else "on CPU"
                self.counts[(app, what)] = self.counts.get((app, what), 0) + 1

    def stop(self) -> dict[str, Any]:
        self.done.set()
        self.thread.join()
        after = self._server()
        self.conn.close()
        ranked = sorted(self.counts.items(), key=lambda kv: (kv[0][0], -kv[1]))
        table = [[app, what, f"{n / self.samples[app]:.1%}"] for (app, what), n in ranked]
        checkpoints = (after[0] - self.before[0], after[1] - self.before[1])
        wal = (after[2] - self.before[2]) / 2**20
        summary = (
            f"checkpoints meanwhile: {checkpoints[0]} timed, {checkpoints[1]} requested (at s: {self.checkpoint_at}); "
            f"WAL written {wal:,.0f} MB"
        )
        return {
            "table": table,
            "summary": summary,
            "checkpoints": checkpoints,
            "checkpoint_at_s": self.checkpoint_at,
            "wal_mb": wal,
            "counts": {f"{a}|{w}": n for (a, w), n in self.counts.items()},
        }


def sizes() -> dict[str, Any]:
    """Table and index sizes, dead tuples (PostgreSQL): the bloat figures of the docs."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return {}
    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT c.relname, pg_relation_size(c.oid), COALESCE(s.n_live_tup, 0), COALESCE(s.n_dead_tup, 0)
            FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
            WHERE c.relname IN ('distsched_app_run', 'distsched_app_runevent')
            UNION ALL
            SELECT i.relname, pg_relation_size(i.oid), NULL, NULL
            FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
            WHERE x.indrelid IN ('distsched_app_run'::regclass, 'distsched_app_runevent'::regclass)
            ORDER BY 2 DESC
            """
        )
        rows = cur.fetchall()
    print()
    print(
        c.table(
            ["relation", "MB", "live tuples", "dead tuples"],
            [
                [n, round(b / 2**20), "" if live is None else live, "" if dead is None else dead]
                for n, b, live, dead in rows
            ],
        )
    )
    return {n: {"bytes": b, "live": live, "dead": dead} for n, b, live, dead in rows}


def stored_figures() -> list[dict[str, Any]]:
    """What each stored figure cost to compute (what the leader pays every ~15 s; readers pay nothing)."""
    from distsched_app.models import StoredFigure

    rows = list(StoredFigure.objects.order_by("key").values_list("key", "seconds"))
    if rows:
        print()
        print(c.table(["stored figure (services.figures)", "compute ms"], [[k, round(s * 1000, 1)] for k, s in rows]))
    return [{"key": k, "seconds": s} for k, s in rows]


def _start_leader():
    log = c.scratch_dir(NAME) / "leader.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    proc = c.spawn(["tick", "--loop"], log)
    time.sleep(3)  # elected and a first turn
    return proc


def _idle_schedule() -> None:
    """``scale-idle``: a schedule with no run (``?schedule=scale-idle``)."""
    from distsched_app.models import Schedule

    if not Schedule.objects.filter(name="scale-idle").exists():
        template = Schedule.objects.filter(name="scale-1").values().first()
        if template is not None:
            template.pop("id")
            Schedule.objects.bulk_create([Schedule(**dict(template, name="scale-idle", paused=True))])


# -- endpoint latency ----------------------------------------------------------


def measure_endpoints(args) -> list[dict[str, Any]]:
    from django.contrib.auth import get_user_model
    from django.test import Client

    user = get_user_model().objects.filter(username="bench").first() or get_user_model().objects.create_superuser(
        "bench", "bench@example.com", "bench-password"
    )
    _idle_schedule()
    client = Client()
    client.force_login(user)
    results = []
    next_page: str | None = None
    for label, url, target in ENDPOINTS:
        if url is None:
            url = next_page
        if url is None:
            results.append({"endpoint": label, "url": None, "status": "n/a (no next page)", "target_ms": target})
            continue
        row = time_endpoint(client, label, url, target, args.requests)
        if label == "GET /api/runs?state=dead" and row.get("next"):
            next_page = row["next"]
        results.append(row)
    rows = []
    for r in results:
        if "p50_ms" in r:
            verdict = "" if r["target_ms"] is None else ("ok" if r["p95_ms"] <= r["target_ms"] else "MISS")
            rows.append(
                [
                    r["endpoint"],
                    r["status"],
                    r["queries"],
                    r["p50_ms"],
                    r["p95_ms"],
                    r["max_ms"],
                    f"<= {r['target_ms']} ms" if r["target_ms"] else "-",
                    verdict,
                ]
            )
        else:
            rows.append([r["endpoint"], r["status"], "", "", "", "", "-", ""])
    print()
    print(c.table(["endpoint", "status", "queries", "p50 ms", "p95 ms", "max ms", "target (p95)", ""], rows))
    return results


def time_endpoint(client, label: str, url: str, target: int | None, count: int) -> dict[str, Any]:
    from django.db import connection

    row: dict[str, Any] = {"endpoint": label, "url": url, "target_ms": target}
    try:
        first = client.get(url)
    except Exception as exc:  # noqa: BLE001 - an endpoint under construction may crash; report it
        row["status"] = f"error ({type(exc).__name__}: {str(exc)[:80]})"
        return row
    if first.status_code in (301, 302, 307, 308) and first.get("Location", "").startswith("/"):
        # Measure where the redirect leads (DESIGN: both /api/x and /api/x/ should answer directly).
        row["redirected_from"] = url
        url = row["url"] = first["Location"]
        first = client.get(url)
    if first.status_code == 404:
        row["status"] = "n/a (404)"
        return row
    if first.status_code != 200:
        row["status"] = f"n/a ({first.status_code})"
        return row
    row["next"] = _next_link(first)
    client.get(url)
    queries = [0]

    def counter(execute, sql, params, many, context):
        queries[0] += 1
        return execute(sql, params, many, context)

    times = []
    with connection.execute_wrapper(counter):
        for _ in range(count):
            start = time.perf_counter()
            response = client.get(url)
            times.append((time.perf_counter() - start) * 1000)
            if response.status_code != 200:
                row["status"] = f"error ({response.status_code})"
                return row
    status = f"200 (via {row['redirected_from']} 301)" if "redirected_from" in row else 200
    row.update(
        status=status,
        queries=queries[0] // count,
        bytes=len(first.content),
        p50_ms=c.percentile(times, 50),
        p95_ms=c.percentile(times, 95),
        max_ms=max(times),
        times_ms=times,
    )
    return row


def _next_link(response) -> str | None:
    if "json" not in response.get("Content-Type", ""):
        return None
    try:
        data = json.loads(response.content)
    except ValueError:
        return None
    link = data.get("next") if isinstance(data, dict) else None
    if not link:
        return None
    return link.split("testserver", 1)[-1] if "testserver" in link else link


# -- EXPLAIN -------------------------------------------------------------------


def capture(fn: Callable[[], Any]) -> list[tuple[str, Any]]:
    """The SELECTs ``fn`` issues, with their parameters (inside a rolled-back transaction)."""
    from django.db import connection, transaction

    seen: list[tuple[str, Any]] = []

    def recorder(execute, sql, params, many, context):
        if not many and sql.lstrip().upper().startswith(("SELECT", "WITH")):
            seen.append((sql, params))
        return execute(sql, params, many, context)

    with transaction.atomic():
        with connection.execute_wrapper(recorder):
            fn()
        transaction.set_rollback(True)
    return seen


def explain(sql: str, params: Any) -> str:
    from django.db import connection, transaction

    with transaction.atomic(), connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql, params)
            text = "\n".join(row[0] for row in cur.fetchall())
        else:
            cur.execute("EXPLAIN QUERY PLAN " + sql, params)
            text = _sqlite_tree(cur.fetchall())
        transaction.set_rollback(True)
    return text


def _sqlite_tree(rows: list[tuple]) -> str:
    depth: dict[int, int] = {0: -1}
    lines = []
    for node, parent, _, detail in rows:
        depth[node] = depth.get(parent, -1) + 1
        lines.append("  " * depth[node] + detail)
    return "\n".join(lines)


def _inline(sql: str, params: Any) -> str:
    """The statement with its parameters, for reading (not for executing)."""
    from django.db import connection

    with connection.cursor() as cur:
        try:
            return (
                connection.ops.last_executed_query(cur, sql, params)
                if connection.vendor == "sqlite"
                else cur.cursor.mogrify(sql, params)
            )
        except Exception:  # noqa: BLE001 - only a display aid
            return f"{sql}  -- params {params!r}"


def explain_hot_queries(args) -> list[dict[str, str]]:
    from django.contrib.auth import get_user_model
    from django.test import Client

    from distsched_app.models import Run
    from distsched_app.services import claiming, stats
    from distsched_app.services.tick import tick

    now = c.now()
    dead = Run.objects.filter(state="dead").order_by("-id")
    ids = list(dead.values_list("id", flat=True)[:200])
    cursor_id = ids[-1] if ids else 0
    client = Client()
    client.force_login(get_user_model().objects.get(username="bench"))
    cases: list[tuple[str, Callable[[], Any]]] = [
        (
            "claim (claim_next_run: lease-expired query, then waiting query)",
            lambda: claiming.claim_next_run(worker_id="bench-explain", queues=["default"], lease_seconds=30, now=now),
        ),
        ("tick due query (tick(now), nothing due)", lambda: tick(now=now)),
        ("run list by state, newest first (ORM, first page)", lambda: list(dead[:51])),
        (
            "run list by state, cursor page (ORM, id < cursor)",
            lambda: list(Run.objects.filter(state="dead", id__lt=cursor_id).order_by("-id")[:51]),
        ),
        (
            "run list filtered by schedule, newest first (ORM)",
            lambda: list(Run.objects.filter(schedule__name="scale-7").order_by("-id")[:51]),
        ),
        ("stats: runs by state GROUP BY (services.stats.runs_by_state)", stats.runs_by_state),
        ("stats: the rest of services.stats.stats", lambda: stats.stats(now=now)),
        ("GET /api/runs?state=dead as served", lambda: _get(client, "/api/runs/?state=dead")),
        ("GET /api/runs?schedule=scale-7 as served", lambda: _get(client, "/api/runs/?schedule=scale-7")),
        ("GET /api/runs?schedule=nope (unknown) as served", lambda: _get(client, "/api/runs/?schedule=nope")),
        ("GET /api/runs?origin=manual as served", lambda: _get(client, "/api/runs/?origin=manual")),
        ("GET /api/runs?queue=nowhere as served", lambda: _get(client, "/api/runs/?queue=nowhere")),
        ("GET /api/runs?task_name=tests.none as served", lambda: _get(client, "/api/runs/?task_name=tests.none")),
        ("GET /api/runs?priority=5 as served", lambda: _get(client, "/api/runs/?priority=5")),
        ("admin dashboard as served", lambda: _get(client, "/admin/distsched_app/run/dashboard/")),
        (
            "admin run changelist ?state__exact=dead as served",
            lambda: _get(client, "/admin/distsched_app/run/?state__exact=dead"),
        ),
        ("admin run changelist (unfiltered) as served", lambda: _get(client, "/admin/distsched_app/run/")),
        ("GET /api/stats as served", lambda: _get(client, "/api/stats/")),
        ("admin run changelist sorted by started as served", lambda: _get(client, "/admin/distsched_app/run/?o=-10")),
        (
            "admin run changelist dead, sorted by started as served",
            lambda: _get(client, "/admin/distsched_app/run/?state=dead&o=-10"),
        ),
        (
            "GET /api/runs?kwargs__account_id=42 as served",
            lambda: _get(client, "/api/runs/?kwargs__account_id=42"),
        ),
        ("GET /api/queues as served", lambda: _get(client, "/api/queues/")),
        ("GET /metrics as served", lambda: _get(client, "/metrics")),
    ]
    plans = []
    done: set[str] = set()
    out_lines = []
    for label, fn in cases:
        try:
            statements = capture(fn)
        except Exception as exc:  # noqa: BLE001 - an adapter under construction may fail
            statements = []
            print(f"\n### {label}: could not run ({type(exc).__name__}: {exc})")
        relevant = [(s, p) for s, p in statements if "distsched_app_" in s]
        if not relevant:
            continue
        for sql, params in relevant:
            key = _inline(sql, params)
            if key in done:
                continue
            done.add(key)
            plan = explain(sql, params)
            plans.append({"case": label, "sql": key, "plan": plan})
            block = f"\n### {label}\n{_abbreviate(key)}\n{plan}"
            out_lines.append(block)
            print(block)
    c.RESULTS.mkdir(parents=True, exist_ok=True)
    path = c.RESULTS / f"explain-{args.db}.txt"
    path.write_text(f"# EXPLAIN of hot queries, {args.runs:,} runs, {c.db_version()}\n" + "\n".join(out_lines) + "\n")
    print(f"\nplans written to {path.relative_to(c.ROOT)}")
    return plans


def _abbreviate(sql: str) -> str:
    """``SELECT <long column list> FROM`` -> ``SELECT ... FROM`` for reading."""
    head, sep, rest = sql.partition(" FROM ")
    if sep and head.upper().startswith("SELECT") and len(head) > 160:
        return f"SELECT ...{len(head.split(','))} columns... FROM {rest}"
    return sql


def _get(client, url: str) -> None:
    response = client.get(url)
    if response.status_code != 200:
        raise RuntimeError(f"{url} answered {response.status_code}")


if __name__ == "__main__":
    sys.exit(main())
