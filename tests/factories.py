"""Small helpers that drive the real services the way a worker does, one run at a time.

Workers record outcomes and renew leases in batches (``record_successes``,
``renew_leases``); a test about one run calls these instead of a singular
twin that no worker would use.
"""

from __future__ import annotations

from datetime import datetime

from distsched_app.models import Run
from distsched_app.services import outcomes


def succeed(
    run: Run | int, *, worker_id: str, attempt: int, now: datetime, result: object = None, note: str = ""
) -> bool:
    """Record one success finishing at ``now`` (its start as claimed); False if the lease was lost."""
    run_id = run if isinstance(run, int) else run.pk
    started_at = Run.objects.filter(pk=run_id).values_list("started_at", flat=True).first()
    lost = outcomes.record_successes(
        worker_id=worker_id,
        now=now,
        successes=[
            outcomes.Success(
                run_id=run_id,
                attempt=attempt,
                started_at=started_at,
                finished_at=now,
                result=result,
                note=note,
            )
        ],
    )
    return run_id not in lost


def renew(run: Run | int, *, worker_id: str, attempt: int, now: datetime, lease_seconds: float) -> bool:
    """Extend one run's lease; False if this worker no longer holds it at that attempt."""
    run_id = run if isinstance(run, int) else run.pk
    renewal = outcomes.renew_leases(worker_id=worker_id, held={run_id: attempt}, now=now, lease_seconds=lease_seconds)
    return run_id in renewal.held
