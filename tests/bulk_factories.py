"""Runs in bulk for the bulk-action tests and benchmark: many rows at once, without a tick."""

from __future__ import annotations

from datetime import datetime, timedelta

from distsched_app.models import TERMINAL_STATES, Origin, Run, RunState, Schedule


def make_runs(
    n: int,
    *,
    now: datetime,
    state: str = RunState.DEAD,
    task_name: str = "tests.noop",
    queue: str = "default",
    schedule: Schedule | None = None,
    unique_key: str = "",
    attempts: int = 3,
    prefix: str = "bulk",
) -> list[int]:
    """``n`` runs in ``state`` (dead: after 3 attempts), ids in creation order."""
    finished = now if state in TERMINAL_STATES else None
    leased = state in (RunState.LEASED, RunState.RUNNING)
    start = Run.objects.count()
    rows = [
        Run(
            task_name=task_name,
            schedule=schedule,
            state=state,
            queue=queue,
            origin=Origin.SCHEDULE if schedule is not None else Origin.ENQUEUED,
            scheduled_for=now + timedelta(seconds=start + i),
            available_at=now,
            created_at=now,
            updated_at=now,
            finished_at=finished,
            attempts=attempts if state != RunState.PENDING else 0,
            max_attempts=3,
            idempotency_key=f"{prefix}:{start + i}",
            unique_key=unique_key,
            lease_owner="w1" if leased else "",
            lease_expires_at=now if leased else None,
        )
        for i in range(n)
    ]
    return [r.pk for r in Run.objects.bulk_create(rows, batch_size=500)]
