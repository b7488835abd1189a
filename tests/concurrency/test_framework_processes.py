"""Runs enqueued through Django's task framework, with real processes on the real database.

A worker SIGKILLed in the middle of an enqueued run: the lease expires, another
worker executes the run again, and its result reports both attempts. Two
processes enqueueing with the same unique key at the same moment: one run.
"""

from __future__ import annotations

import signal
import textwrap

import pytest

from distsched_app import framework
from distsched_app.models import EventType, Run, RunEvent, RunState
from tests.concurrency.procs import finish, manage, wait_for
from tests.testapp import tasks as t
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BOOT = 90  # seconds a child process may take to start on a loaded machine


def test_an_enqueued_run_whose_worker_is_killed_is_recovered_by_lease_expiry():
    result = t.ft_record.using(backend="retrying").enqueue(sleep=60)  # the first attempt hangs
    run_id = int(result.id)
    victim = manage(
        "runworker", "--worker-id=victim", "--lease-seconds=2", "--heartbeat-seconds=0.5", "--poll-interval=0.1"
    )
    try:
        assert wait_for(lambda: Execution.objects.filter(run_id=run_id).exists(), timeout=BOOT), "never started"
        victim.send_signal(signal.SIGKILL)
    finally:
        finish([victim], timeout=30)
    assert Run.objects.get(pk=run_id).state == RunState.RUNNING  # held by a dead worker's lease
    rescuer = manage("runworker", "--worker-id=rescuer", "--lease-seconds=2", "--poll-interval=0.1")
    try:
        assert wait_for(lambda: Run.objects.get(pk=run_id).state == RunState.SUCCEEDED, timeout=BOOT), "not recovered"
    finally:
        rescuer.send_signal(signal.SIGTERM)
        [(code, _, stderr)] = finish([rescuer], timeout=60)
    assert code == 0, stderr[-2000:]
    result.refresh()
    assert result.status == framework.TaskResultStatus.SUCCESSFUL and result.return_value == 2
    assert result.worker_ids == ["victim", "rescuer"] and result.attempts == 2
    kinds = list(RunEvent.objects.filter(run_id=run_id).order_by("id").values_list("event_type", flat=True))
    assert EventType.LEASE_EXPIRED in kinds and kinds[-1] == EventType.SUCCEEDED
    assert sorted(Execution.objects.filter(run_id=run_id).values_list("worker_id", flat=True)) == [
        "rescuer", "victim"]  # fmt: skip


ENQUEUER = textwrap.dedent(
    """
    import pathlib, time
    from django.db import transaction
    from distsched_app.backends import enqueue_unique
    from tests.testapp.tasks import ft_add
    barrier = pathlib.Path("{barrier}")
    (barrier / "ready-{me}").touch()
    deadline = time.monotonic() + 120
    while len(list(barrier.glob("ready-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.005)  # both processes are up: enqueue at the same moment
    with transaction.atomic():
        result = enqueue_unique(ft_add, "{key}", 1, 2)
        time.sleep(0.5)  # hold the transaction open: the other enqueuer arrives meanwhile
    print("RESULT", result.id)
    """
)


@pytest.mark.parametrize("round_", range(3))
def test_two_concurrent_enqueuers_with_one_unique_key_make_one_run(round_, tmp_path):
    key = f"nightly-export:{round_}"
    enqueuers = [manage("shell", "-c", ENQUEUER.format(key=key, barrier=tmp_path, me=i)) for i in range(2)]
    results = finish(enqueuers, timeout=BOOT + 60)
    ids = set()
    for code, stdout, stderr in results:
        assert code == 0, stderr[-2000:]
        ids.add(next(line.split()[1] for line in stdout.splitlines() if line.startswith("RESULT")))
    assert len(ids) == 1, "both enqueuers must get the same run"
    assert Run.objects.filter(unique_key=key).count() == 1
    assert RunEvent.objects.filter(run__unique_key=key, event_type=EventType.CREATED).count() == 1
