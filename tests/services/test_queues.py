"""Paused queues: pause, resume, idempotency, history, and what the claim makes of a pause."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from distsched_app.db import notify
from distsched_app.errors import ValidationError
from distsched_app.models import EventType, QueueAction, QueueEvent, QueuePause, Run, RunEvent, RunState
from distsched_app.services import claiming, queues
from distsched_app.services.enqueue import Job, enqueue
from tests.concurrency.procs import received
from tests.conftest import T0

pytestmark = pytest.mark.django_db


def run_in(queue: str, clock, **options) -> Run:
    return enqueue(Job(task_name="tests.noop", queue=queue, **options), now=clock.now()).run


def claim(clock, queues_served=None, worker="w1", lease=30):
    return claiming.claim_next_run(worker_id=worker, queues=queues_served, lease_seconds=lease, now=clock.now())


def history(queue: str) -> list[tuple]:
    return list(
        QueueEvent.objects.filter(queue=queue).order_by("id").values_list("action", "actor", "reason", "created_at")
    )


# ------------------------------------------------------------------ pause, resume


def test_pause_records_who_when_and_why(clock):
    change = queues.pause_queue("reports", now=clock.now(), by="user:alice", reason="vendor outage")
    assert (change.queue, change.changed) == ("reports", True)
    pause = QueuePause.objects.get()
    assert (pause.queue, pause.paused_at, pause.paused_by) == ("reports", T0, "user:alice")
    assert pause.reason == "vendor outage"
    assert change.pause == pause
    assert history("reports") == [(QueueAction.PAUSE, "user:alice", "vendor outage", T0)]
    assert [p.queue for p in queues.paused_queues()] == ["reports"]


def test_pausing_a_paused_queue_keeps_the_first_pause_and_writes_nothing(clock):
    queues.pause_queue("reports", now=clock.now(), by="user:alice", reason="vendor outage")
    clock.advance(seconds=60)
    again = queues.pause_queue("reports", now=clock.now(), by="cli:bob", reason="another reason")
    assert again.changed is False
    assert (again.pause.paused_by, again.pause.paused_at, again.pause.reason) == ("user:alice", T0, "vendor outage")
    assert QueuePause.objects.count() == 1 and QueueEvent.objects.count() == 1


def test_resume_deletes_the_pause_and_history_still_says_who_paused_and_why(clock):
    queues.pause_queue("reports", now=clock.now(), by="user:alice", reason="vendor outage")
    clock.advance(seconds=90)
    change = queues.resume_queue("reports", now=clock.now(), by="cli:bob")
    assert change.changed is True
    assert (change.pause.paused_by, change.pause.reason) == ("user:alice", "vendor outage")  # the pause lifted
    assert not QueuePause.objects.exists() and queues.paused_queues() == []
    assert history("reports") == [
        (QueueAction.PAUSE, "user:alice", "vendor outage", T0),
        (QueueAction.RESUME, "cli:bob", "", T0 + timedelta(seconds=90)),
    ]
    assert [e.action for e in queues.queue_events("reports")] == ["resume", "pause"]  # newest first


def test_resuming_a_queue_that_is_not_paused_writes_nothing(clock):
    change = queues.resume_queue("reports", now=clock.now(), by="code:tests")
    assert (change.changed, change.pause) == (False, None)
    assert not QueueEvent.objects.exists()


def test_pause_and_resume_again_is_a_new_pause(clock):
    queues.pause_queue("q", now=clock.now(), by="code:a", reason="one")
    queues.resume_queue("q", now=clock.now(), by="code:a")
    clock.advance(seconds=5)
    change = queues.pause_queue("q", now=clock.now(), by="code:b", reason="two")
    assert change.changed and change.pause.reason == "two" and change.pause.paused_at == T0 + timedelta(seconds=5)
    assert [a for a, *_ in history("q")] == ["pause", "resume", "pause"]


@pytest.mark.parametrize(
    ("name", "options", "field"),
    [
        ("bad name", {}, "queue"),
        ("", {}, "queue"),
        ("x" * 101, {}, "queue"),
        (7, {}, "queue"),
        ("ok", {"by": ""}, "by"),
        ("ok", {"by": "x" * 201}, "by"),
        ("ok", {"reason": "x" * (queues.MAX_REASON + 1)}, "reason"),
        ("ok", {"reason": "nul\x00"}, "reason"),
        ("ok", {"reason": 5}, "reason"),
    ],
)
def test_bad_input_is_a_typed_error_and_writes_nothing(clock, name, options, field):
    with pytest.raises(ValidationError) as caught:
        queues.pause_queue(name, now=clock.now(), **{"by": "code:tests", **options})
    assert caught.value.field == field
    assert not QueuePause.objects.exists() and not QueueEvent.objects.exists()


def test_queue_names_follow_distsched_queues_and_a_dropped_queue_can_still_be_resumed(clock, settings):
    queues.pause_queue("legacy", now=clock.now(), by="code:tests")
    settings.DISTSCHED = {"QUEUES": ["default", "emails"]}
    with pytest.raises(ValidationError, match="not one of DISTSCHED"):
        queues.pause_queue("typo", now=clock.now(), by="code:tests")
    with pytest.raises(ValidationError, match="not one of DISTSCHED"):
        queues.resume_queue("typo", now=clock.now(), by="code:tests")  # nothing paused there: still refused
    assert queues.resume_queue("legacy", now=clock.now(), by="code:tests").changed  # else stuck paused forever


def test_list_queues_gives_unfinished_runs_by_state_and_the_pauses(clock):
    run_in("default", clock)
    run_in("default", clock)
    run_in("emails", clock)
    claim(clock, ["emails"])
    done = run_in("old", clock)
    Run.objects.filter(pk=done.pk).update(state=RunState.SUCCEEDED)  # finished only: not listed
    queues.pause_queue("reports", now=clock.now(), by="user:alice", reason="vendor outage")  # paused, no runs
    found = {q.queue: q for q in queues.list_queues()}
    assert list(found) == ["default", "emails", "reports"]
    assert found["default"].runs == {"pending": 2, "retrying": 0, "blocked": 0, "leased": 0, "running": 0}
    assert found["emails"].runs == {"pending": 0, "retrying": 0, "blocked": 0, "leased": 0, "running": 1}
    assert not found["default"].paused
    assert found["reports"].paused and found["reports"].pause.reason == "vendor outage"
    assert found["reports"].runs == {"pending": 0, "retrying": 0, "blocked": 0, "leased": 0, "running": 0}


def test_list_queues_is_two_queries(clock, django_assert_num_queries):
    for queue in ("a", "b", "c"):
        run_in(queue, clock)
        queues.pause_queue(queue, now=clock.now(), by="code:tests")
    with django_assert_num_queries(2):
        queues.list_queues()


def test_the_scheduler_facade_pauses_as_code_on_its_clock(scheduler, clock):
    assert scheduler.pause_queue("q", reason="batch import").changed
    assert (QueuePause.objects.get().paused_by, QueuePause.objects.get().paused_at) == ("code", T0)
    assert scheduler.resume_queue("q", by="code:myapp.jobs").changed
    assert QueueEvent.objects.order_by("-id").first().actor == "code:myapp.jobs"


# ------------------------------------------------------------------ the claim


def test_a_paused_queues_due_runs_are_not_claimed_others_are_and_resumed_ones_are(clock):
    held = run_in("held", clock, priority=100)  # first in line, if the pause did not hold it
    other = run_in("default", clock)
    queues.pause_queue("held", now=clock.now(), by="code:tests")
    assert claim(clock, ["held"]) is None
    assert claim(clock).pk == other.pk
    assert claim(clock) is None
    queues.resume_queue("held", now=clock.now(), by="code:tests")
    assert claim(clock).pk == held.pk


def test_next_due_ignores_paused_queues(clock):
    run_in("held", clock, run_after=T0 + timedelta(seconds=5))
    run_in("default", clock, run_after=T0 + timedelta(seconds=30))
    queues.pause_queue("held", now=clock.now(), by="code:tests")
    assert claiming.next_due(queues=None).run == T0 + timedelta(seconds=30)  # not the paused run's 5 s
    assert claiming.next_due(queues=["held"]).run is None  # an idle worker of it sleeps, not spins
    queues.resume_queue("held", now=clock.now(), by="code:tests")
    assert claiming.next_due(queues=None).run == T0 + timedelta(seconds=5)


def test_an_expired_lease_in_a_paused_queue_is_recovered_to_pending_not_reclaimed(clock):
    run = run_in("held", clock)
    claim(clock, lease=10)  # worker w1 takes it, then dies
    queues.pause_queue("held", now=clock.now(), by="user:alice", reason="vendor outage")
    clock.advance(seconds=11)
    assert claim(clock, worker="w2") is None
    run.refresh_from_db()
    assert (run.state, run.lease_owner, run.lease_expires_at, run.attempts) == (RunState.PENDING, "", None, 1)
    note = RunEvent.objects.get(run=run, event_type=EventType.LEASE_EXPIRED).message
    assert "queue held is paused" in note
    queues.resume_queue("held", now=clock.now(), by="user:alice")
    again = claim(clock, worker="w2")
    assert (again.pk, again.attempts) == (run.pk, 2)


def test_an_expired_lease_out_of_attempts_in_a_paused_queue_is_still_marked_dead(clock):
    run = enqueue(Job(task_name="tests.noop", queue="held"), now=clock.now()).run
    Run.objects.filter(pk=run.pk).update(max_attempts=1)
    claim(clock, lease=10)
    queues.pause_queue("held", now=clock.now(), by="code:tests")
    clock.advance(seconds=11)
    assert claim(clock, worker="w2") is None
    run.refresh_from_db()
    assert run.state == RunState.DEAD


def test_runs_already_claimed_carry_on_after_a_pause(clock):
    run_in("held", clock)
    run = claim(clock, lease=60)
    queues.pause_queue("held", now=clock.now(), by="code:tests")
    run.refresh_from_db()
    assert run.state == RunState.RUNNING  # a pause stops claims, not execution


def test_a_pause_costs_the_claim_no_query_of_its_own(clock):
    """The pause is a sub-select inside the claim's statement, not a query of its own."""

    def queries_of_a_claim() -> list[str]:
        run_in("default", clock)
        with CaptureQueriesContext(connection) as captured:
            assert claiming.claim_runs(
                worker_id="w1", queues=None, lease_seconds=30, now=clock.now(), include_expired=False
            )
        return [q["sql"] for q in captured.captured_queries]

    unpaused = queries_of_a_claim()
    queues.pause_queue("held", now=clock.now(), by="code:tests")
    paused = queries_of_a_claim()
    assert len(paused) == len(unpaused)
    assert any("distsched_app_queuepause" in sql for sql in paused)


# ------------------------------------------------------------------ the wake-up at resume


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_resume_notifies_its_queue_at_commit_and_pause_does_not(clock):
    listening = notify.Listener(notify.conninfo())
    try:
        queues.pause_queue("held", now=clock.now(), by="code:tests")
        queues.pause_queue("held", now=clock.now(), by="code:tests")
        assert listening.wait(0.3) == []
        with transaction.atomic():
            queues.resume_queue("held", now=clock.now(), by="code:tests")
            assert listening.wait(0.3) == []  # not before the commit
        assert received(listening) == ["held"]
        queues.resume_queue("held", now=clock.now(), by="code:tests")  # not paused: no wake-up
        assert listening.wait(0.3) == []
    finally:
        listening.close()
