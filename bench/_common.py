"""Shared plumbing for the benchmark scripts (not a test helper).

Every script owns a scratch database: a temporary SQLite file or a
``distsched_bench_<name>`` PostgreSQL database that is dropped at exit (``BENCH_SCRATCH_NAME`` in
the environment names that database and the scratch folder ``/tmp/bench-<it>`` instead, and
``$BENCH_PG_DB_PREFIX`` replaces the database name's prefix: two checkouts' runs of one script
then never share them). The
environment (``DATABASE_URL``, ``DJANGO_SETTINGS_MODULE=tests.settings``,
``DJANGO_DEBUG=0``) is set before ``django.setup()`` and handed unchanged to
the worker and ticker processes, which are real ``manage.py`` commands.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PG_ADMIN_URL = os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432")
# The scratch PostgreSQL database is ``<prefix><script>``: a second checkout (a before/after
# comparison) or another user of the server picks its own prefix.
PG_DB_PREFIX = os.environ.get("BENCH_PG_DB_PREFIX", "distsched_bench_")
TASK = "tests.noop"

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

_children: list[subprocess.Popen] = []


# -- arguments -----------------------------------------------------------------


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    p.add_argument("--keep", action="store_true", help="Keep the scratch database (and its path) after the run.")
    p.add_argument(
        "--log-level",
        default="WARNING",
        help="DISTSCHED_LOG_LEVEL of the child processes (INFO logs every run; default WARNING).",
    )
    p.add_argument("--debug", action="store_true", help="Run Django with DEBUG=True (query log on; slower).")
    return p


# -- scratch database ----------------------------------------------------------


def compile_checkout() -> None:
    """Byte-compile the checkout's packages, as installing a wheel does (pip compiles at install).

    The worker and ticker processes a benchmark spawns import them; an environment with
    ``PYTHONDONTWRITEBYTECODE`` (CI's, this machine's) never writes their ``.pyc`` files, so every
    spawn compiled ~100 modules from source again: about 0.1 s of each start-up that a deployed
    worker does not pay, and the peers (installed packages) did not either."""
    import compileall

    for package in ("distsched_app", "scheduler_project", "tests", "examples", "bench"):
        compileall.compile_dir(str(ROOT / package), quiet=2, workers=1)


@contextmanager
def scratch_database(name: str, args: argparse.Namespace, settings: str = "tests.settings") -> Iterator[str]:
    """Create the scratch database, configure Django (``settings``) for it, migrate; drop it at exit.
    The checkout is byte-compiled first (``compile_checkout``)."""
    compile_checkout()
    folder = scratch_dir(name)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    dbname = os.environ.get("BENCH_SCRATCH_NAME") or f"{PG_DB_PREFIX}{name}"
    if args.db == "sqlite":
        url = f"sqlite:///{folder / 'bench.sqlite3'}"
    else:
        _pg_admin(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        _pg_admin(f'CREATE DATABASE "{dbname}"')
        url = f"{PG_ADMIN_URL.replace('postgresql://', 'postgres://')}/{dbname}"
    _environment(url, args, settings)
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        yield url
    finally:
        stop_children()
        signal.signal(signal.SIGTERM, previous)
        try:
            from django.db import connections

            connections.close_all()
        except Exception:  # noqa: BLE001 - cleanup must go on
            pass
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
            if args.db == "postgres":
                _pg_admin(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        else:
            print(f"kept scratch database: {url}")


def _environment(url: str, args: argparse.Namespace, settings: str) -> None:
    """The environment Django and the spawned ``manage.py`` children read: database, settings, logging."""
    os.environ.update(
        DATABASE_URL=url,
        DJANGO_SETTINGS_MODULE=settings,
        DJANGO_DEBUG="1" if args.debug else "0",
        DISTSCHED_LOG_LEVEL=args.log_level,
        PYTHONUNBUFFERED="1",
    )


@contextmanager
def existing_database(url: str, args: argparse.Namespace, settings: str = "tests.settings") -> Iterator[str]:
    """Configure Django for a database that outlives the run (``--database-url``): created if it does not
    exist yet, migrated, never dropped."""
    ensure_database(url)
    compile_checkout()
    _environment(url, args, settings)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    try:
        yield url
    finally:
        stop_children()
        from django.db import connections

        connections.close_all()


def ensure_database(url: str) -> None:
    """Create the PostgreSQL database ``url`` names if the server has none by that name; any other
    connection failure ends the benchmark with one line (not a traceback). A ``sqlite:///PATH`` file
    is created by the migration; only its folder must exist."""
    import psycopg
    from psycopg import sql

    if url.startswith("sqlite:///"):
        folder = Path(url[len("sqlite:///") :]).parent
        if not folder.is_dir():
            raise SystemExit(f"--database-url: the folder {folder} does not exist")
        return
    if not url.startswith(("postgres://", "postgresql://")):
        raise SystemExit(f"--database-url: a PostgreSQL or sqlite:/// URL is expected, not {url!r}")
    try:
        psycopg.connect(url, connect_timeout=10).close()
        return
    except psycopg.OperationalError as exc:
        if "does not exist" not in str(exc):
            raise SystemExit(f"cannot connect to {url}: {str(exc).strip().splitlines()[-1]}") from None
    server, _, name = url.rpartition("/")
    name = name.split("?", 1)[0]
    try:
        with psycopg.connect(f"{server}/postgres", autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except psycopg.Error as exc:
        raise SystemExit(f"cannot create database {name!r} on {server}: {str(exc).strip().splitlines()[-1]}") from None
    print(f"created database {name} (it did not exist)")


def scratch_dir(name: str) -> Path:
    """The script's scratch folder: ``/tmp/bench-<name>``, or ``BENCH_SCRATCH_NAME``'s (module docstring)."""
    return Path(f"/tmp/bench-{os.environ.get('BENCH_SCRATCH_NAME') or name}")


def _pg_admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(f"{PG_ADMIN_URL}/postgres", autocommit=True) as conn:
        conn.execute(sql)


def vendor() -> str:
    from django.db import connection

    return connection.vendor


def db_version() -> str:
    from django.db import connection

    with connection.cursor() as cur:
        if connection.vendor == "sqlite":
            cur.execute("select sqlite_version()")
            return "SQLite " + cur.fetchone()[0]
        cur.execute("show server_version")
        return "PostgreSQL " + cur.fetchone()[0]


def analyze() -> None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("ANALYZE")


def reset_tables() -> None:
    """Empty the scheduler tables between repetitions (children must be stopped)."""
    from django.db import connection, transaction

    tables = ["distsched_app_runevent", "distsched_app_worker", "distsched_app_run", "distsched_app_schedule"]
    with transaction.atomic(), connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")
        else:
            for table in tables:
                cur.execute(f"DELETE FROM {table}")


# -- child processes -----------------------------------------------------------


def spawn(args: Sequence[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``manage.py <args>`` with the benchmark's environment (plus ``env``); output to ``log``."""
    handle = open(log, "ab")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=handle,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    handle.close()
    _children.append(proc)
    return proc


def worker_command(*, worker_id: str, poll_interval: float, burst: bool, extra: Sequence[str]) -> list[str]:
    cmd = ["runworker", "--worker-id", worker_id, "--poll-interval", str(poll_interval)]
    if burst:
        cmd.append("--burst")
    return cmd + list(extra)


def stop_children(timeout: float = 15.0) -> None:
    """SIGTERM the processes this script started (only those), then kill stragglers."""
    for proc in _children:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in _children:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    _children.clear()


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def rss_mb(pid: int) -> tuple[float, float] | None:
    """(VmRSS, VmHWM) of a live process, in MB; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    if "VmRSS" not in values:
        return None
    return values["VmRSS"], values.get("VmHWM", values["VmRSS"])


def server_cpu_seconds() -> float | None:
    """CPU seconds the local PostgreSQL server's processes have used so far (user and system: each
    live process's own, and the ended backends' its postmaster collected), from ``/proc``; None
    when none is readable (SQLite, a server on another machine, no ``/proc``). Differences of two
    readings give the server's share of a step: on a shared machine a steadier measure than wall
    time, which other guests' load stretches."""
    total, found = 0, False
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != "postgres":
                continue
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found = True
        total += sum(int(v) for v in fields[11:15])  # utime, stime, cutime, cstime
    return total / os.sysconf("SC_CLK_TCK") if found else None


def children_cpu_seconds() -> float:
    """CPU seconds (user and system) of this process's child processes that have been waited for."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# -- seeding -------------------------------------------------------------------


def now() -> datetime:
    return datetime.now(UTC)


def schedule_template(kind: str) -> dict[str, Any]:
    """Field values exactly as ``create_schedule`` produces them (validated once, then cloned)."""
    from django.db import transaction

    from distsched_app.models import Schedule
    from distsched_app.services.schedules import create_schedule

    t = now()
    opts: dict[str, Any] = {"run_at": t + timedelta(hours=1)} if kind == "once" else {"interval_seconds": 60}
    with transaction.atomic():
        schedule = create_schedule(name="bench-template", task_name=TASK, now=t, **opts)
        fields = {f.attname: getattr(schedule, f.attname) for f in Schedule._meta.concrete_fields if f.attname != "id"}
        transaction.set_rollback(True)
    return fields


def bulk_schedules(
    prefix: str, count: int, make: Callable[[int], dict[str, Any]], kind: str, batch: int = 5000
) -> None:
    """Insert ``count`` schedules cloned from the validated template, ``make(i)`` overriding fields.

    One ``executemany`` per batch with the values Django itself would bind
    (``get_db_prep_save``): ``bulk_create`` is held to 999 parameters per
    statement on SQLite, which makes 100,000 rows take half a minute.
    """
    from django.db import connection, transaction

    from distsched_app.models import Schedule

    base = schedule_template(kind)
    fields = [f for f in Schedule._meta.concrete_fields if not f.primary_key]
    qn = connection.ops.quote_name
    sql = (
        f"INSERT INTO {qn(Schedule._meta.db_table)} ({', '.join(qn(f.column) for f in fields)}) "
        f"VALUES ({', '.join(['%s'] * len(fields))})"
    )
    for start in range(0, count, batch):
        rows = []
        for i in range(start, min(count, start + batch)):
            values = dict(base, name=f"{prefix}-{i}")
            values.update(make(i))
            rows.append([f.get_db_prep_save(values[f.attname], connection) for f in fields])
        with transaction.atomic(), connection.cursor() as cur:
            cur.executemany(sql, rows)


def seed_due_runs(count: int, prefix: str = "due") -> dict[str, float]:
    """``count`` pending runs of the no-op task, produced by the real tick.

    Once-schedules whose slot has just passed are inserted in bulk, then
    ``services.tick.tick`` turns them into runs (with their ``created`` events),
    so the runs are exactly what production creates.
    """
    from distsched_app.services.tick import tick

    t0 = time.perf_counter()
    base = now() - timedelta(seconds=5)

    def make(i: int) -> dict[str, Any]:
        slot = base + timedelta(microseconds=i)
        return {"run_at": slot, "next_run_at": slot, "created_at": base, "updated_at": base}

    bulk_schedules(prefix, count, make, "once")
    t1 = time.perf_counter()
    created = tick(now=now())
    t2 = time.perf_counter()
    if len(created) != count:
        raise SystemExit(f"seeding: tick created {len(created)} runs, expected {count}")
    return {"schedules_s": t1 - t0, "tick_s": t2 - t1}


def succeeded_count() -> int:
    from distsched_app.models import Run, RunState

    return Run.objects.filter(state=RunState.SUCCEEDED).count()


def event_coverage() -> dict[str, dict[str, int]]:
    """Per event type: events and distinct runs."""
    from django.db.models import Count

    from distsched_app.models import RunEvent

    rows = (
        RunEvent.objects.order_by()
        .values("event_type")
        .annotate(events=Count("id"), runs=Count("run_id", distinct=True))
    )
    return {r["event_type"]: {"events": r["events"], "runs": r["runs"]} for r in rows}


def states() -> dict[str, int]:
    from django.db.models import Count

    from distsched_app.models import Run

    return {r["state"]: r["n"] for r in Run.objects.order_by().values("state").annotate(n=Count("id"))}


# -- statistics and output -----------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    out = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)), "  ".join("-" * w for w in widths)]
    for row in cells:
        out.append("  ".join(c.rjust(w) if _numeric(c) else c.ljust(w) for c, w in zip(row, widths, strict=True)))
    return "\n".join(out)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if value != value:
            return "n/a"
        return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.3f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _numeric(text: str) -> bool:
    return text.replace(",", "").replace(".", "").replace("-", "").isdigit()


def metadata(args: argparse.Namespace) -> dict[str, Any]:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "distsched_app"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        if dirty:
            commit += " + uncommitted changes in distsched_app"
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {
        "date": now().isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(),
        "python": platform.python_version(),
        "database": db_version(),
        "commit": commit,
        "argv": sys.argv[1:],
        "args": {k: v for k, v in vars(args).items()},
    }


def write_results(name: str, args: argparse.Namespace, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}-{args.db}.json"
    payload = {"benchmark": name, "meta": metadata(args), **data}
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"\nresults written to {path.relative_to(ROOT)}")
    return path


def header(title: str, args: argparse.Namespace) -> None:
    print(f"== {title} ({db_version()}; {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}) ==")
