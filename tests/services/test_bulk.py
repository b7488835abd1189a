"""Bulk actions on a filter (services.bulk): dry run, exact scope, batches, resume, one processor, one audit entry."""

from __future__ import annotations

import pytest

from distsched_app.errors import BulkActionNotFound, InvalidStateTransition, ValidationError
from distsched_app.models import AuditEntry, AuditTarget, BulkAction, BulkState, EventType, Run, RunEvent, RunState
from distsched_app.services import bulk, runs
from tests.bulk_factories import make_runs

pytestmark = pytest.mark.django_db


def states(ids) -> set[str]:
    return set(Run.objects.filter(pk__in=ids).values_list("state", flat=True))


def events_of(ids, kind) -> int:
    return RunEvent.objects.filter(run_id__in=ids, event_type=kind).count()


class Died(BaseException):
    """A processor killed after a batch (no cleanup: not an Exception, not a Ctrl-C)."""


def test_dry_run_counts_matching_runs_and_writes_nothing(clock):
    make_runs(5, now=clock.now(), task_name="tests.noop")
    make_runs(3, now=clock.now(), task_name="tests.other")
    make_runs(2, now=clock.now(), state=RunState.SUCCEEDED)
    before = (Run.objects.count(), RunEvent.objects.count(), AuditEntry.objects.count())
    found = bulk.preview(action="requeue", filter={"state": "dead", "task_name": "tests.noop"})
    assert found.count == 5
    assert bulk.preview(action="requeue", filter={}).count == 8  # no state: the states requeue applies to
    assert (Run.objects.count(), RunEvent.objects.count(), AuditEntry.objects.count()) == before
    assert not BulkAction.objects.exists()


def test_requeue_by_filter_acts_exactly_on_matching_runs(clock):
    target = make_runs(7, now=clock.now(), queue="reports")
    other_queue = make_runs(4, now=clock.now(), queue="emails")
    finished = make_runs(2, now=clock.now(), queue="reports", state=RunState.SUCCEEDED)
    job = bulk.create_bulk_action(action="requeue", filter={"state": "dead", "queue": "reports"}, now=clock.now())
    assert job.state == BulkState.PENDING and job.matched == 7
    assert states(target) == {RunState.DEAD}  # creating the job acts on nothing
    bulk.process_bulk_actions(clock, batch_size=3)
    job.refresh_from_db()
    assert states(target) == {RunState.PENDING}
    assert states(other_queue) == {RunState.DEAD} and states(finished) == {RunState.SUCCEEDED}
    assert (job.state, job.done, job.skipped, job.batches) == (BulkState.DONE, 7, 0, 3)
    assert job.finished_at == clock.now() and job.lease_owner == ""
    run = Run.objects.get(pk=target[0])
    assert run.max_attempts == run.attempts + 3 and run.finished_at is None
    # Each run's own history shows it, naming the job.
    assert events_of(target, EventType.REQUEUED) == 7
    message = RunEvent.objects.filter(run_id=target[0], event_type=EventType.REQUEUED).get().message
    assert f"bulk action {job.pk}" in message and "code" in message


def test_runs_created_after_the_job_are_not_touched(clock):
    before = make_runs(3, now=clock.now())
    job = bulk.create_bulk_action(action="requeue", filter={"state": "dead"}, now=clock.now())
    after = make_runs(2, now=clock.now(), prefix="late")
    bulk.process_bulk_actions(clock)
    job.refresh_from_db()
    assert job.max_run_id == before[-1]
    assert states(before) == {RunState.PENDING} and states(after) == {RunState.DEAD}


def test_cancel_by_filter_cancels_waiting_and_asks_running_to_stop(clock, make_schedule):
    pending = make_runs(3, now=clock.now(), state=RunState.PENDING, queue="q")
    running = make_runs(2, now=clock.now(), state=RunState.RUNNING, queue="q")
    dead = make_runs(2, now=clock.now(), queue="q")
    job = bulk.create_bulk_action(action="cancel", filter={"queue": "q"}, now=clock.now(), reason="outage")
    assert job.matched == 5
    bulk.process_bulk_actions(clock)
    assert states(pending) == {RunState.CANCELLED} and states(dead) == {RunState.DEAD}
    assert states(running) == {RunState.RUNNING}
    assert set(Run.objects.filter(pk__in=running).values_list("cancel_requested", flat=True)) == {True}
    assert events_of(pending, EventType.CANCELLED) == 3 and events_of(running, EventType.CANCEL_REQUESTED) == 2
    # A second job finds the running runs already asked: skipped, no second event.
    again = bulk.create_bulk_action(action="cancel", filter={"queue": "q", "state": "running"}, now=clock.now())
    bulk.process_bulk_actions(clock)
    again.refresh_from_db()
    assert (again.done, again.skipped) == (0, 2) and events_of(running, EventType.CANCEL_REQUESTED) == 2


def test_audited_once_with_the_filter_and_the_count(clock):
    make_runs(25, now=clock.now())
    job = bulk.create_bulk_action(
        action="requeue", filter={"state": "dead"}, now=clock.now(), actor="user:alice", source="api", reason="fixed"
    )
    bulk.process_bulk_actions(clock, batch_size=10)
    entries = list(AuditEntry.objects.all())
    assert len(entries) == 1
    [entry] = entries
    assert (entry.target_kind, entry.target, entry.action) == (AuditTarget.BULK, str(job.pk), "requeue")
    assert (entry.actor, entry.source, entry.reason) == ("user:alice", "api", "fixed")
    assert entry.data["filter"] == {"state": "dead"} and entry.data["matched"] == 25


def test_a_unique_key_held_by_another_run_is_skipped_not_fatal(clock):
    [held] = make_runs(1, now=clock.now(), task_name="tests.noop", unique_key="k")
    [other] = make_runs(1, now=clock.now(), task_name="tests.noop", unique_key="k", prefix="second")
    plain = make_runs(3, now=clock.now(), prefix="plain")
    job = bulk.create_bulk_action(action="requeue", filter={"state": "dead"}, now=clock.now())
    bulk.process_bulk_actions(clock)
    job.refresh_from_db()
    # Two dead runs of one task and key: the first is requeued, the second would make two unfinished.
    assert Run.objects.get(pk=held).state == RunState.PENDING and Run.objects.get(pk=other).state == RunState.DEAD
    assert states(plain) == {RunState.PENDING}
    assert (job.state, job.done, job.skipped) == (BulkState.DONE, 4, 1)


def test_resume_after_a_crash_goes_on_from_the_cursor(clock):
    ids = make_runs(10, now=clock.now())
    job = bulk.create_bulk_action(action="requeue", filter={"state": "dead"}, now=clock.now())

    def die(after):
        raise Died

    with pytest.raises(Died):
        bulk.process_bulk_actions(clock, owner="first", batch_size=4, progress=die)
    job.refresh_from_db()
    assert (job.state, job.cursor, job.done, job.lease_owner) == (BulkState.RUNNING, ids[3], 4, "first")
    # Its lease has not run out: nobody else may work on it yet.
    assert bulk.process_bulk_actions(clock, owner="second", batch_size=4).batches == 0
    clock.advance(bulk.LEASE_SECONDS + 1)
    done = bulk.process_bulk_actions(clock, owner="second", batch_size=4)
    job.refresh_from_db()
    assert done.batches == 2 and (job.state, job.done, job.skipped, job.batches) == (BulkState.DONE, 10, 0, 3)
    assert states(ids) == {RunState.PENDING}
    # Each run requeued exactly once: nothing redone, nothing skipped.
    assert (
        list(
            RunEvent.objects.filter(run_id__in=ids, event_type=EventType.REQUEUED)
            .order_by("run_id")
            .values_list("run_id", flat=True)
        )
        == ids
    )


def test_the_old_owner_cannot_write_once_another_took_the_job(clock):
    ids = make_runs(6, now=clock.now())
    job = bulk.create_bulk_action(action="requeue", filter={"state": "dead"}, now=clock.now())
    assert bulk.acquire("A", clock.now()).pk == job.pk
    assert bulk.acquire("B", clock.now()) is None  # A holds it
    clock.advance(bulk.LEASE_SECONDS)
    assert bulk.acquire("B", clock.now()).pk == job.pk  # A's lease ran out
    with pytest.raises(bulk.LeaseLost):
        bulk.process_batch(job.pk, "A", clock.now(), batch_size=2)
    job.refresh_from_db()
    assert (job.cursor, job.done, job.lease_owner) == (ids[0] - 1, 0, "B")  # A's batch wrote nothing
    assert states(Run.objects.values_list("pk", flat=True)) == {RunState.DEAD}


def test_ctrl_c_gives_the_lease_up_and_leaves_the_job_resumable(clock):
    ids = make_runs(6, now=clock.now())
    job = bulk.create_bulk_action(action="requeue", filter={"state": "dead"}, now=clock.now())

    def interrupt(after):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        bulk.process_bulk_actions(clock, owner="cli", batch_size=2, progress=interrupt)
    job.refresh_from_db()
    assert (job.state, job.done, job.lease_owner, job.lease_expires_at) == (BulkState.RUNNING, 2, "", None)
    bulk.process_bulk_actions(clock, owner="worker")  # at once: no lease to wait for
    job.refresh_from_db()
    assert job.state == BulkState.DONE and states(ids) == {RunState.PENDING}


def test_a_budget_stops_between_batches_and_says_more_is_left(clock):
    make_runs(6, now=clock.now())
    job = bulk.create_bulk_action(action="requeue", filter={"state": "dead"}, now=clock.now())
    first = bulk.process_bulk_actions(clock, batch_size=2, budget_seconds=0)
    job.refresh_from_db()
    assert (first.batches, first.more) == (1, True)  # out of time: one batch, then the lease given up
    assert (job.state, job.done, job.lease_owner) == (BulkState.RUNNING, 2, "")
    rest = bulk.process_bulk_actions(clock, batch_size=2)
    job.refresh_from_db()
    assert (rest.batches, rest.more, job.state, job.done) == (2, False, BulkState.DONE, 6)


def test_no_matching_run_makes_a_job_already_done(clock):
    make_runs(2, now=clock.now(), state=RunState.SUCCEEDED)
    job = bulk.create_bulk_action(action="requeue", filter={}, now=clock.now())
    assert (job.state, job.matched, job.finished_at) == (BulkState.DONE, 0, clock.now())
    assert bulk.process_bulk_actions(clock).batches == 0


def test_a_batch_that_fails_marks_its_job_failed(clock, monkeypatch):
    make_runs(3, now=clock.now())
    job = bulk.create_bulk_action(action="requeue", filter={"state": "dead"}, now=clock.now())

    def broken(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setitem(bulk.ACTS, "requeue", broken)
    bulk.process_bulk_actions(clock)
    job.refresh_from_db()
    assert job.state == BulkState.FAILED and "disk on fire" in job.error and job.lease_owner == ""
    assert states(Run.objects.values_list("pk", flat=True)) == {RunState.DEAD}


def test_a_sparse_filter_moves_the_cursor_by_windows(clock, monkeypatch):
    monkeypatch.setattr(bulk, "ID_WINDOW", 5)
    [first] = make_runs(1, now=clock.now(), task_name="tests.noop", prefix="one")
    ids = make_runs(12, now=clock.now(), task_name="tests.other")
    [last] = make_runs(1, now=clock.now(), task_name="tests.noop", prefix="two")
    job = bulk.create_bulk_action(action="requeue", filter={"task_name": "tests.noop"}, now=clock.now())
    assert job.cursor == first - 1  # starts at the first matching run
    bulk.process_bulk_actions(clock)
    job.refresh_from_db()
    # 14 ids from the first match to the last, 5 per batch at most: 3 batches, each short.
    assert (job.done, job.batches, job.cursor) == (2, 3, last) and states(ids) == {RunState.DEAD}


@pytest.mark.parametrize(
    ("action", "filter", "field"),
    [
        ("delete", {}, "action"),
        ("requeue", {"colour": "red"}, "filter.colour"),
        ("requeue", {"state": "exploded"}, "filter.state"),
        ("requeue", {"state": "succeeded"}, "filter.state"),  # requeue never applies to it
        ("cancel", {"state": ["dead", "cancelled"]}, "filter.state"),
        ("requeue", {"priority": 1000}, "filter.priority"),
        ("requeue", {"created_after": "yesterday"}, "filter.created_after"),
        ("requeue", {"finished_before": "2026-03-02T09:00:00"}, "filter.finished_before"),  # no offset
        ("requeue", {"queue": ""}, "filter.queue"),
        ("requeue", ["state", "dead"], "filter"),
    ],
)
def test_bad_input_is_a_validation_error_naming_the_field(clock, action, filter, field):
    with pytest.raises(ValidationError) as caught:
        bulk.create_bulk_action(action=action, filter=filter, now=clock.now())
    assert caught.value.field == field
    assert not BulkAction.objects.exists() and not AuditEntry.objects.exists()


def test_time_bounds_and_state_lists(clock):
    early = make_runs(2, now=clock.now())
    clock.advance(hours=1)
    late = make_runs(2, now=clock.now(), state=RunState.CANCELLED, prefix="late")
    found = bulk.preview(
        action="requeue", filter={"state": ["dead", "cancelled"], "created_after": clock.now().isoformat()}
    )
    assert found.count == 2 and found.filter["created_after"].endswith("Z")
    job = bulk.create_bulk_action(
        action="requeue", filter={"finished_before": clock.now().isoformat()}, now=clock.now()
    )
    bulk.process_bulk_actions(clock)
    job.refresh_from_db()
    assert states(early) == {RunState.PENDING} and states(late) == {RunState.CANCELLED} and job.done == 2


def test_unknown_job(clock):
    with pytest.raises(BulkActionNotFound):
        bulk.get_bulk_action(12345)
    with pytest.raises(BulkActionNotFound):
        bulk.get_bulk_action("x")


def test_batch_services_skip_runs_no_longer_in_an_allowed_state(clock):
    ids = make_runs(3, now=clock.now())
    Run.objects.filter(pk=ids[0]).update(state=RunState.PENDING)
    outcome = runs.requeue_many(ids, now=clock.now(), reason="by test", states=["dead"])
    assert (outcome.done, outcome.skipped) == (2, 1)


def test_a_worker_loop_works_on_bulk_actions_between_claims(clock):
    from distsched_app.worker import Worker

    ids = make_runs(5, now=clock.now())
    job = bulk.create_bulk_action(action="requeue", filter={"state": "dead"}, now=clock.now())
    worker = Worker(worker_id="w-bulk", clock=clock, heartbeat_seconds=3600)
    worker.loop.maybe_bulk()
    job.refresh_from_db()
    assert job.state == BulkState.DONE and states(ids) == {RunState.PENDING}
    later = bulk.create_bulk_action(action="cancel", filter={"state": "pending"}, now=clock.now())
    worker.loop.maybe_bulk()  # nothing was left last time: the next look waits BULK_IDLE_SECONDS
    assert BulkAction.objects.get(pk=later.pk).state == BulkState.PENDING


def test_stopping_a_job_keeps_what_its_batches_did_and_starts_no_other(clock):
    ids = make_runs(6, now=clock.now())
    job = bulk.create_bulk_action(action="requeue", filter={"state": "dead"}, now=clock.now())
    bulk.process_bulk_actions(clock, owner="A", batch_size=2, budget_seconds=0)  # one batch, then let go
    bulk.acquire("B", clock.now())
    stopped = bulk.stop_bulk_action(job.pk, now=clock.now(), actor="user:ann", source="api", reason="wrong filter")
    assert (stopped.state, stopped.done, stopped.finished_at, stopped.lease_owner) == ("cancelled", 2, clock.now(), "")
    with pytest.raises(bulk.LeaseLost):  # B's next batch finds it stopped and writes nothing
        bulk.process_batch(job.pk, "B", clock.now(), batch_size=2)
    assert bulk.process_bulk_actions(clock).batches == 0
    assert sorted(Run.objects.filter(pk__in=ids).values_list("state", flat=True)) == ["dead"] * 4 + ["pending"] * 2
    entry = AuditEntry.objects.order_by("id").last()
    assert (entry.action, entry.target, entry.actor, entry.reason) == ("stop", str(job.pk), "user:ann", "wrong filter")
    with pytest.raises(InvalidStateTransition):
        bulk.stop_bulk_action(job.pk, now=clock.now())


def test_an_error_in_bulk_work_never_stops_the_worker_loop(clock, monkeypatch, caplog):
    from distsched_app.worker import Worker

    def broken(*args, **kwargs):
        raise RuntimeError("no such table: distsched_app_bulkaction")

    make_runs(2, now=clock.now())
    bulk.create_bulk_action(action="requeue", filter={"state": "dead"}, now=clock.now())  # one waits
    monkeypatch.setattr(bulk, "process_bulk_actions", broken)
    worker = Worker(worker_id="w-bulk", clock=clock, heartbeat_seconds=3600)
    worker.loop.maybe_bulk()  # logged, not raised
    [record] = [r for r in caplog.records if r.getMessage().startswith("error in bulk actions")]
    assert "no such table" in record.distsched["error"]
