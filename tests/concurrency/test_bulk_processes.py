"""Bulk actions processed by real processes at once: three workers (each gives the job's lease up
after half a second, so they hand it to each other) and a ``distsched bulk process`` started beside
them. Every run is requeued exactly once, the counts add up, nothing is left behind."""

from __future__ import annotations

import signal
from collections import Counter

import pytest

from distsched_app.models import BulkAction, BulkState, EventType, Run, RunEvent, RunState
from distsched_app.services import bulk
from tests.bulk_factories import make_runs
from tests.concurrency.procs import finish, manage, wait_for
from tests.conftest import T0

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = 12_000
BOOT = 120  # seconds for children to start and finish on a loaded machine


def test_several_processes_share_a_job_and_requeue_each_run_exactly_once():
    ids = make_runs(RUNS, now=T0, queue="bulkq")
    bystander = make_runs(50, now=T0, queue="other", prefix="other")  # not matched: never touched
    job = bulk.create_bulk_action(action="requeue", filter={"queue": "bulkq", "state": "dead"}, now=T0)
    workers = [
        manage("runworker", f"--worker-id=bulk-{i}", "--queues=nothing-here", "--poll-interval=0.05") for i in range(3)
    ]
    foreground = manage("distsched", "bulk", "process", str(job.pk), "--batch-size", "500")
    try:
        assert wait_for(
            lambda: BulkAction.objects.values_list("state", flat=True).get(pk=job.pk) == BulkState.DONE, timeout=BOOT
        ), BulkAction.objects.filter(pk=job.pk).values().get()
    finally:
        for proc in workers:
            proc.send_signal(signal.SIGTERM)
        results = finish([*workers, foreground], timeout=60)
    for code, _, stderr in results:
        assert code == 0, stderr[-2000:]
    job.refresh_from_db()
    assert (job.matched, job.done, job.skipped) == (RUNS, RUNS, 0)
    requeued = Counter(
        RunEvent.objects.filter(event_type=EventType.REQUEUED, run_id__in=ids).values_list("run_id", flat=True)
    )
    assert len(requeued) == RUNS and set(requeued.values()) == {1}  # each run once: no batch done twice
    assert set(Run.objects.filter(pk__in=ids).values_list("state", flat=True)) == {RunState.PENDING}
    assert set(Run.objects.filter(pk__in=bystander).values_list("state", flat=True)) == {RunState.DEAD}
    assert job.lease_owner == "" and job.lease_expires_at is None
