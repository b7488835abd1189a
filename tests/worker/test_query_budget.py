"""Pin the database work per executed run: batches amortise it."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from distsched_app.models import Run, RunEvent, RunState

pytestmark = pytest.mark.django_db


def queries_to_drain(scheduler, n: int, prefetch: int) -> int:
    for i in range(n):
        scheduler.create_schedule(name=f"q{n}-{i}", task_name="tests.noop", interval_seconds=3600)
    scheduler.tick()
    worker = scheduler.worker(worker_id=f"w{n}", prefetch=prefetch, heartbeat_seconds=3600)
    worker.register()
    worker.pace.observe(0.0)  # known-quick tasks: full batches from the first claim
    worker.loop.next_expired_check = float("inf")  # lease recovery is periodic, not per batch
    with CaptureQueriesContext(connection) as captured:
        assert worker.run(burst=True, install_signals=False) == n
    return len(captured)


def test_statements_per_batch_do_not_grow_with_runs(scheduler):
    small = queries_to_drain(scheduler, 8, prefetch=8)  # one batch
    large = queries_to_drain(scheduler, 32, prefetch=8)  # four batches
    per_batch = (large - small) / 3
    print(f"\nstatements: {small} for 1 batch of 8, {large} for 4 batches; {per_batch:g} per extra batch of 8")
    # Claim (select + update + events on SQLite; one statement on PostgreSQL) and flush (select +
    # update + events), with their transaction statements: a fixed cost per batch, whatever its size.
    assert per_batch == PER_BATCH[connection.vendor]
    assert per_batch / 8 < 2
    # A batch twice as large costs the same statements.
    assert queries_to_drain(scheduler, 16, prefetch=16) == small
    assert Run.objects.filter(state=RunState.SUCCEEDED).count() == 56
    assert RunEvent.objects.filter(event_type="succeeded").count() == 56


# Statements Django sees per extra batch: SQLite 6 + 2 savepoint pairs (the test runs inside a
# transaction); PostgreSQL: the claim is one statement (db/claims.py, no savepoint), the flush a
# savepoint pair, its select, and its update written with the release of limit slots as one
# statement (db.holds; the array-bound event insert bypasses Django's cursor).
PER_BATCH = {"sqlite": 10, "postgresql": 4}
