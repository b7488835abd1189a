"""What a live worker costs the database: one transaction per heartbeat (fenced), jittered beats,
and an idle poll that backs off while notifications wake the worker."""

from __future__ import annotations

import random
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from distsched_app.models import Run, RunState
from distsched_app.models import Worker as WorkerRow
from distsched_app.services import outcomes
from distsched_app.services.enqueue import Job, enqueue
from distsched_app.worker.heartbeat import Heartbeat
from distsched_app.worker.pacing import IdleBackoff, idle_ceiling, jittered

# Transaction bookkeeping (the test's own transaction makes the service's atomic blocks savepoints).
BOOKKEEPING = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE SAVEPOINT")


def make_runs(scheduler, n: int) -> None:
    for i in range(n):
        scheduler.create_schedule(name=f"h{i}", task_name="tests.noop", interval_seconds=3600)
    scheduler.tick()


def holding(scheduler, n: int, **options):
    make_runs(scheduler, n)
    worker = scheduler.worker(worker_id="w", prefetch=n, lease_seconds=10, heartbeat_seconds=3600, **options)
    worker.register()
    worker.held.hold(worker.loop.claim(n))
    return worker


# -- one transaction per beat, fenced --------------------------------------------------------------


@pytest.mark.django_db
def test_a_beat_moves_the_worker_row_and_renews_every_lease_in_one_transaction(scheduler, clock):
    worker = holding(scheduler, 3)
    worker.heartbeat_thread._next_skew_check = float("inf")  # the skew's own query is not the beat's
    clock.advance(seconds=8)
    with CaptureQueriesContext(connection) as queries:
        worker.heartbeat()
    statements = [q["sql"] for q in queries.captured_queries if not q["sql"].startswith(BOOKKEEPING)]
    # PostgreSQL: one statement (autocommit); SQLite: fencing read + renewal + row, under one BEGIN IMMEDIATE.
    assert len(statements) == (1 if connection.vendor == "postgresql" else 3)
    assert set(Run.objects.values_list("lease_expires_at", flat=True)) == {clock.now() + timedelta(seconds=10)}
    assert WorkerRow.objects.get(worker_id="w").heartbeat_at == clock.now()


@pytest.mark.django_db
def test_a_beat_extends_only_the_leases_held_at_the_attempt_the_worker_holds(scheduler, clock):
    worker = holding(scheduler, 3)
    taken, stale, kept = sorted(worker.held.leases())
    before = Run.objects.get(pk=taken).lease_expires_at
    # One run taken over by another worker (new owner, next attempt); one re-claimed by this very
    # worker at a later attempt (the beat still holds the old attempt: a zombie's token).
    Run.objects.filter(pk=taken).update(lease_owner="other", attempts=2)
    Run.objects.filter(pk=stale).update(attempts=2)
    clock.advance(seconds=8)
    renewal = outcomes.renew_leases(
        worker_id="w", held=worker.held.leases(), now=clock.now(), lease_seconds=10, row=None
    )
    assert renewal.held == {kept}
    assert Run.objects.get(pk=kept).lease_expires_at == clock.now() + timedelta(seconds=10)
    assert Run.objects.get(pk=taken).lease_expires_at == before
    assert Run.objects.get(pk=stale).lease_expires_at == before


@pytest.mark.django_db
def test_a_finished_run_is_not_renewed_and_the_beat_reports_it_lost(scheduler, clock, caplog):
    worker = holding(scheduler, 2)
    done, kept = sorted(worker.held.leases())
    Run.objects.filter(pk=done).update(state=RunState.SUCCEEDED, lease_owner="w")
    clock.advance(seconds=5)
    worker.heartbeat()
    assert any(r.getMessage() == "lease lost while holding run" for r in caplog.records)
    assert Run.objects.get(pk=done).lease_expires_at != clock.now() + timedelta(seconds=10)
    assert Run.objects.get(pk=kept).lease_expires_at == clock.now() + timedelta(seconds=10)


@pytest.mark.django_db
def test_a_beat_learns_of_cancel_requests_and_re_registers_a_deleted_row(scheduler, clock):
    worker = holding(scheduler, 1)
    [run_id] = worker.held.leases()
    scheduler.cancel_run(run_id)
    WorkerRow.objects.filter(worker_id="w").delete()  # an operator's prune
    worker.heartbeat()
    assert worker.held.cancel_requested(run_id)
    assert WorkerRow.objects.filter(worker_id="w").exists()


@pytest.mark.django_db
def test_the_beat_keeps_columns_it_does_not_set(scheduler, clock):
    holding(scheduler, 1)
    WorkerRow.objects.filter(worker_id="w").update(clock_skew_seconds=0.5, status="stopping")
    renewal = outcomes.renew_leases(
        worker_id="w",
        held={},
        now=clock.now(),
        lease_seconds=10,
        row=outcomes.heartbeat.RowBeat(heartbeat_at=clock.now(), runs_executed=7),
    )
    assert renewal.alive is True
    row = WorkerRow.objects.get(worker_id="w")
    assert (row.clock_skew_seconds, row.status, row.runs_executed, row.current_run_id) == (0.5, "stopping", 7, None)


# -- jitter ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("draw", "expected"), [(0.0, 5.0), (0.5, 4.5), (1.0, 4.0)])
def test_jitter_only_shortens_the_interval_within_its_bound(draw, expected):
    assert jittered(5.0, 0.2, lambda: draw) == pytest.approx(expected)


@pytest.mark.django_db
def test_heartbeat_intervals_stay_within_bounds_and_two_workers_drift_apart(scheduler):
    worker = scheduler.worker(worker_id="j", heartbeat_seconds=5, heartbeat_jitter=0.2)
    one, two = Heartbeat(worker, rand=random.Random(1).random), Heartbeat(worker, rand=random.Random(2).random)
    firsts = [one.interval() for _ in range(1000)]
    seconds = [two.interval() for _ in range(1000)]
    assert all(4.0 <= s <= 5.0 for s in firsts + seconds)
    assert max(firsts) - min(firsts) > 0.9  # spread over the whole band
    # Started together, after ten beats they are apart: no lockstep.
    assert abs(sum(firsts[:10]) - sum(seconds[:10])) > 0.1


@pytest.mark.django_db
def test_no_jitter_keeps_the_exact_interval(scheduler):
    worker = scheduler.worker(worker_id="j0", heartbeat_seconds=5, heartbeat_jitter=0)
    assert Heartbeat(worker, rand=lambda: 1.0).interval() == 5.0


# -- idle backoff ----------------------------------------------------------------------------------


def test_idle_polls_back_off_while_listening_up_to_the_ceiling():
    idle = IdleBackoff(poll=1.0, ceiling=10.0, jitter=0.0)
    assert [idle.next_delay(listening=True) for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    idle.found_work()
    assert idle.next_delay(listening=True) == 1.0


def test_without_a_listener_the_idle_poll_stays_at_the_poll_interval():
    idle = IdleBackoff(poll=1.0, ceiling=10.0, jitter=0.2, rand=lambda: 1.0)
    for _ in range(3):
        idle.next_delay(listening=True)
    assert [idle.next_delay(listening=False) for _ in range(3)] == [1.0, 1.0, 1.0]


def test_idle_delays_are_jittered_within_bounds():
    rng = random.Random(7)
    idle = IdleBackoff(poll=1.0, ceiling=8.0, jitter=0.2, rand=rng.random)
    delays = [idle.next_delay(listening=True) for _ in range(200)]
    assert delays[0] == 1.0  # never under the poll interval
    assert all(6.4 <= d <= 8.0 for d in delays[4:])
    assert len(set(delays[4:])) > 100


def test_the_idle_ceiling_is_bounded_by_half_the_lease_and_never_under_the_poll():
    assert idle_ceiling(poll=1.0, lease_seconds=30, maximum=10) == 10
    assert idle_ceiling(poll=0.05, lease_seconds=2, maximum=10) == 1.0
    assert idle_ceiling(poll=5.0, lease_seconds=2, maximum=10) == 5.0


@pytest.mark.django_db
def test_an_idle_worker_without_notifications_polls_at_the_poll_interval(scheduler, monkeypatch):
    worker = scheduler.worker(worker_id="idle", poll_interval=0.5, lease_seconds=30, heartbeat_seconds=3600)
    waits: list[float] = []
    monkeypatch.setattr(worker, "wait", lambda seconds: waits.append(seconds) or False)
    for _ in range(3):
        worker.loop.idle_wait()
    assert waits == [0.5, 0.5, 0.5]


@pytest.mark.django_db
def test_an_idle_worker_woken_by_notifications_polls_rarely_but_wakes_for_a_due_run(scheduler, clock, monkeypatch):
    worker = scheduler.worker(worker_id="idle", poll_interval=1.0, lease_seconds=30, heartbeat_seconds=3600)
    worker.loop.idle.jitter = 0.0
    worker.wakeup.connected.set()  # a listener is connected
    waits: list[float] = []
    monkeypatch.setattr(worker, "wait", lambda seconds: waits.append(seconds) or False)
    for _ in range(5):
        worker.loop.idle_wait()
    assert waits == [1.0, 2.0, 4.0, 8.0, 10.0]
    enqueue(Job(task_name="tests.noop", run_after=clock.now() + timedelta(seconds=3)), now=clock.now())
    worker.loop.idle_wait()
    assert waits[-1] == pytest.approx(3.001)  # a run due sooner than the backed-off poll shortens the wait


@pytest.mark.django_db
def test_an_idle_worker_backing_off_looks_for_chores_as_rarely(scheduler):
    worker = scheduler.worker(worker_id="idle", poll_interval=1.0, lease_seconds=30, heartbeat_seconds=3600)
    worker.loop.idle.current = 10.0  # polls backed off to 10 s
    before = time.monotonic()
    worker.loop.maybe_sweep()
    worker.loop.maybe_bulk()
    assert worker.loop._next_sweep >= before + 10 and worker.loop._next_bulk >= before + 10
    worker.loop.idle.found_work()  # busy again: the chores' own pace
    worker.loop._next_sweep = worker.loop._next_bulk = 0.0
    worker.loop.maybe_sweep()
    worker.loop.maybe_bulk()
    assert worker.loop._next_sweep <= time.monotonic() + 5 and worker.loop._next_bulk <= time.monotonic() + 5
