"""Worker registration, heartbeat and clock skew.

Liveness (alive, stale, stopped) is a reading of the row, not a write: the
model's one rule, ``Worker.liveness(now)`` and ``Worker.objects.alive/stale/stopped``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from django.db import transaction

from ..db import server
from ..models import Worker, WorkerStatus
from ..text import storable

HOSTNAME_MAX = 255


def register_worker(
    *,
    worker_id: str,
    hostname: str,
    pid: int,
    queues: Sequence[str],
    now: datetime,
    capabilities: Sequence[str] = (),
    tasks: Sequence[str] | None = None,
) -> Worker:
    """Upsert the worker row at start (a restarted worker reuses its id)."""
    with transaction.atomic():
        worker, _ = Worker.objects.update_or_create(
            worker_id=worker_id,
            defaults={
                "hostname": storable(hostname, HOSTNAME_MAX),
                "pid": pid,
                "queues": list(queues),
                "capabilities": list(capabilities),
                "tasks": None if tasks is None else sorted(tasks),
                "started_at": now,
                "heartbeat_at": now,
                "status": WorkerStatus.ACTIVE,
                "current_run": None,
                "clock_skew_seconds": None,
                "runs_executed": 0,
            },
        )
    return worker


def publish_tasks(*, worker_id: str, tasks: Sequence[str]) -> None:
    """The task names a worker has registered now (it imported a framework task's module on demand)."""
    Worker.objects.filter(worker_id=worker_id).update(tasks=sorted(tasks))


def heartbeat(
    *,
    worker_id: str,
    now: datetime,
    status: str | None = None,
    current_run_id: int | None = None,
    runs_executed: int | None = None,
    clock_skew_seconds: float | None = None,
) -> bool:
    """Move ``heartbeat_at``; False if the row is gone (the caller re-registers)."""
    changes: dict[str, object] = {"heartbeat_at": now, "current_run_id": current_run_id}
    if status is not None:
        changes["status"] = status
    if runs_executed is not None:
        changes["runs_executed"] = runs_executed
    if clock_skew_seconds is not None:
        changes["clock_skew_seconds"] = clock_skew_seconds
    with transaction.atomic():
        return bool(Worker.objects.filter(worker_id=worker_id).update(**changes))


def set_status(*, worker_id: str, status: str, now: datetime, runs_executed: int | None = None) -> None:
    with transaction.atomic():
        changes: dict[str, object] = {"status": status, "heartbeat_at": now}
        if runs_executed is not None:
            changes["runs_executed"] = runs_executed
        if status == WorkerStatus.STOPPED:
            changes["current_run"] = None
        Worker.objects.filter(worker_id=worker_id).update(**changes)


def list_workers() -> list[Worker]:
    return list(Worker.objects.all())


def measure_clock_skew() -> float | None:
    """Seconds this machine's clock is ahead of the database server's (PostgreSQL only).

    Leases compare timestamps written by different machines, so a worker whose
    clock runs ahead would see leases expire early. SQLite shares the machine's
    clock, so there is nothing to measure. Half the round trip is allowed for.
    """
    from django.utils import timezone

    before = timezone.now()
    db_now = server.clock_timestamp()
    if db_now is None:
        return None
    after = timezone.now()
    local = before + (after - before) / 2
    return (local - db_now).total_seconds()


def database_label() -> str:
    """The database workers and tickers talk to, as their start log line names it (no credentials)."""
    return server.describe()
