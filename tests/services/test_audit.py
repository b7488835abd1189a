"""The audit trail: every schedule change is a version recorded in its own transaction, restore,
optimistic concurrency, the action log of runs, queues and limits, and history outliving deletes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction

from distsched_app import errors
from distsched_app.models import AuditEntry, Run, RunState, Schedule
from distsched_app.services import audit, enqueue, limit_overrides, maintenance, queues, schedules
from tests.conftest import T0

pytestmark = pytest.mark.django_db


def trail(name: str = "s1") -> list[tuple]:
    """The schedule's entries, oldest first: (version, action, actor, source, reason, changes)."""
    return [
        (e.version, e.action, e.actor, e.source, e.reason, e.changes)
        for e in AuditEntry.objects.filter(target_kind="schedule", target=name).order_by("id")
    ]


# ---------------------------------------------------------------- versions


def test_create_is_version_one_with_its_configuration(scheduler):
    s = scheduler.create_schedule(name="s1", task_name="tests.noop", interval_seconds=60, reason="nightly import")
    assert s.version == Schedule.objects.get().version == 1
    [entry] = AuditEntry.objects.all()
    assert (entry.version, entry.action, entry.actor, entry.source, entry.reason) == (
        1, "create", "code", "code", "nightly import",
    )  # fmt: skip
    assert (entry.schedule_id, entry.created_at) == (s.pk, T0)
    assert entry.snapshot["interval_seconds"] == 60 and entry.snapshot["name"] == "s1"
    assert "next_run_at" not in entry.snapshot and "version" not in entry.snapshot
    assert entry.changes["interval_seconds"] == [None, 60]


def test_update_makes_a_version_with_the_changed_fields_only(scheduler, make_schedule, clock):
    make_schedule("s1", interval_seconds=60)
    clock.advance(minutes=5)
    s = scheduler.update_schedule("s1", interval_seconds=120, max_attempts=7, actor="code:deploy", reason="slower")
    assert s.version == 2
    *_, (version, action, actor, source, reason, changes) = trail()
    assert (version, action, actor, source, reason) == (2, "update", "code:deploy", "code", "slower")
    # next_run_at moved too (a changed recurrence restarts from now), but it is the system's: not listed.
    assert changes == {"interval_seconds": [60, 120], "max_attempts": [3, 7]}
    assert AuditEntry.objects.latest("id").created_at == clock.now()


def test_an_update_that_changes_nothing_writes_nothing(scheduler, make_schedule):
    before = make_schedule("s1", interval_seconds=60)
    s = scheduler.update_schedule("s1", interval_seconds=60, queue="default")
    assert s.version == 1 and AuditEntry.objects.count() == 1
    assert Schedule.objects.get().updated_at == before.updated_at


def test_a_refused_change_records_nothing(scheduler, make_schedule):
    make_schedule("s1")
    with pytest.raises(errors.InvalidCron):
        scheduler.update_schedule("s1", cron="not a cron")
    with pytest.raises(errors.ValidationError):
        scheduler.update_schedule("s1", max_attempts=2, actor="")  # no one acts: refused before any write
    with pytest.raises(errors.ValidationError):
        schedules.pause_schedule("s1", now=T0, source="somewhere")
    assert [a for _, a, *_ in trail()] == ["create"] and Schedule.objects.get().version == 1


def test_the_entry_is_in_the_changes_transaction(scheduler, make_schedule):
    make_schedule("s1")

    class Later(Exception):
        pass

    with pytest.raises(Later), transaction.atomic():
        scheduler.update_schedule("s1", max_attempts=9)
        scheduler.pause("s1", reason="maintenance")
        assert AuditEntry.objects.count() == 3
        raise Later  # whatever rolls the change back takes its entry with it
    assert AuditEntry.objects.count() == 1
    assert Schedule.objects.values_list("version", "max_attempts", "paused").get() == (1, 3, False)


def test_entries_outside_a_transaction_are_refused():
    with pytest.raises(RuntimeError):
        transaction.get_connection().in_atomic_block = False  # as autocommit code would be
        try:
            audit.record(kind="queue", target="q", action="pause", now=T0, who=("code", "code", ""))
        finally:
            transaction.get_connection().in_atomic_block = True


def test_pause_takes_a_reason_and_only_real_changes_are_versions(scheduler, make_schedule):
    make_schedule("s1")
    scheduler.pause("s1", actor="user:ann", reason="vendor outage")
    scheduler.pause("s1", reason="again")  # already paused: nothing
    scheduler.resume("s1")
    scheduler.resume("s1")
    assert trail()[1:] == [
        (2, "pause", "user:ann", "code", "vendor outage", {"paused": [False, True]}),
        (3, "resume", "code", "code", "", {"paused": [True, False]}),
    ]


def test_runs_carry_the_version_that_made_them(scheduler, make_schedule, clock):
    make_schedule("s1", interval_seconds=60)
    [first] = scheduler.tick()
    scheduler.update_schedule("s1", max_attempts=5)
    clock.advance(seconds=60)
    [second] = scheduler.tick()
    manual = scheduler.trigger("s1")
    assert [Run.objects.get(pk=r.pk).schedule_version for r in (first, second, manual)] == [1, 2, 2]
    assert manual.schedule_version == 2
    done = enqueue.enqueue(enqueue.Job(task_name="tests.noop"), now=clock.now(), message="by code")
    assert Run.objects.get(pk=done.run.pk).schedule_version is None


def test_a_trigger_is_recorded_at_the_version_in_force(scheduler, make_schedule):
    make_schedule("s1")
    run = scheduler.trigger("s1", actor="user:bob", reason="rerun after the fix")
    entry = AuditEntry.objects.latest("id")
    assert (entry.action, entry.version, entry.actor, entry.reason) == ("trigger", 1, "user:bob", "rerun after the fix")
    assert entry.data == {"run": run.pk} and entry.snapshot is None
    assert Schedule.objects.get().version == 1  # the schedule did not change
    scheduler.update_schedule("s1", max_attempts=4, expected_version=1)  # a trigger is no conflict


def test_expected_version_refuses_a_change_made_since(scheduler, make_schedule):
    make_schedule("s1")
    scheduler.update_schedule("s1", max_attempts=5)  # someone else: version 2
    with pytest.raises(errors.VersionConflict) as info:
        scheduler.update_schedule("s1", max_attempts=9, expected_version=1)
    assert info.value.current == 2 and "version 2, not 1" in str(info.value)
    assert Schedule.objects.get().max_attempts == 5 and AuditEntry.objects.count() == 2
    assert scheduler.update_schedule("s1", max_attempts=9, expected_version=2).version == 3
    with pytest.raises(errors.ValidationError):
        scheduler.update_schedule("s1", max_attempts=1, expected_version="3")


# ---------------------------------------------------------------- restore


def test_restore_brings_a_version_back_as_a_new_version(scheduler, make_schedule, clock):
    make_schedule("s1", cron="0 3 * * *", timezone="Europe/Paris", kwargs={"a": 1})
    scheduler.update_schedule("s1", interval_seconds=600, kwargs={"a": 2})  # v2: another kind
    scheduler.pause("s1", reason="investigating")  # v3
    clock.advance(hours=1)
    s = scheduler.restore("s1", 1, actor="user:ann", reason="back to the cron")
    assert (s.version, s.kind, s.cron, s.timezone, s.interval_seconds, s.kwargs) == (
        4, "cron", "0 3 * * *", "Europe/Paris", None, {"a": 1},
    )  # fmt: skip
    assert s.paused  # restoring a configuration does not resume
    assert s.next_run_at > clock.now()  # the recurrence restarted from now
    version, action, actor, _, reason, changes = trail()[-1]
    assert (version, action, actor, reason) == (4, "restore", "user:ann", "back to the cron")
    assert changes["kind"] == ["interval", "cron"] and changes["kwargs"] == [{"a": 2}, {"a": 1}]
    assert AuditEntry.objects.latest("id").data == {"restored": 1}
    assert [a for _, a, *_ in trail()] == ["create", "update", "pause", "restore"]  # nothing rewritten


def test_restoring_the_current_configuration_is_still_a_version(scheduler, make_schedule):
    make_schedule("s1")
    assert scheduler.restore("s1", 1).version == 2
    assert trail()[-1][1:] == ("restore", "code", "code", "", {})


def test_restore_of_an_unknown_version_or_schedule(scheduler, make_schedule):
    make_schedule("s1")
    scheduler.trigger("s1")
    for version in (2, 99):
        with pytest.raises(errors.UnknownVersion):
            scheduler.restore("s1", version)
    with pytest.raises(errors.ValidationError):
        scheduler.restore("s1", 0)
    with pytest.raises(errors.ScheduleNotFound):
        scheduler.restore("nope", 1)
    with pytest.raises(errors.VersionConflict):
        scheduler.restore("s1", 1, expected_version=7)
    assert Schedule.objects.get().version == 1


def test_restoring_a_once_schedule_whose_time_has_passed_is_refused(scheduler, clock):
    scheduler.create_schedule(name="once", task_name="tests.noop", run_at=T0 + timedelta(hours=1))
    scheduler.update_schedule("once", run_at=T0 + timedelta(days=1))
    clock.advance(hours=2)
    with pytest.raises(errors.RunAtInPast):
        scheduler.restore("once", 1)
    assert Schedule.objects.get().version == 2


# ---------------------------------------------------------------- delete


def test_the_history_outlives_the_schedule_and_a_new_one_goes_on_numbering(scheduler, make_schedule):
    make_schedule("s1")
    [run] = scheduler.tick()
    assert scheduler.worker(worker_id="w", heartbeat_seconds=3600).run(burst=True, install_signals=False) == 1
    assert scheduler.delete_schedule("s1", actor="user:ann", reason="replaced by s2") == 1
    entry = AuditEntry.objects.latest("id")
    assert (entry.action, entry.version, entry.reason, entry.data) == ("delete", 2, "replaced by s2", {"runs": 1})
    assert entry.snapshot["task_name"] == "tests.noop"  # what it was
    assert [e.action for e in audit.schedule_history("s1")] == ["delete", "create"]
    kept = Run.objects.get(pk=run.pk)
    assert (kept.state, kept.schedule_id, kept.deleted_schedule, kept.schedule_version) == (
        RunState.SUCCEEDED, None, "s1", 1,
    )  # fmt: skip
    again = make_schedule("s1", interval_seconds=300)
    assert again.version == 3  # a name's versions never repeat
    assert scheduler.restore("s1", 1).interval_seconds == 60  # the old one's configuration
    with pytest.raises(errors.ScheduleNotFound):
        audit.schedule_history("never-was")


def test_runs_of_a_deleted_schedule_show_its_name(scheduler, make_schedule):
    from distsched_app.models import schedule_name_of
    from distsched_app.services import queries

    make_schedule("gone")
    [run] = scheduler.tick()
    scheduler.delete_schedule("gone")
    assert queries.runs().get(pk=run.pk).schedule_name == "gone"
    assert schedule_name_of(Run.objects.get(pk=run.pk)) == "gone"
    # Requeued, it runs again with the settings' retry policy (its schedule's is gone).
    assert scheduler.requeue_run(run.pk).state == RunState.PENDING


# ---------------------------------------------------------------- the action log


def test_run_cancel_and_requeue_are_in_the_action_log(scheduler, make_schedule):
    make_schedule("s1")
    [run] = scheduler.tick()
    scheduler.cancel_run(run.pk, actor="user:ann", reason="wrong input")
    scheduler.requeue_run(run.pk)
    entries = list(audit.entries(kind="run", target=str(run.pk)).order_by("id"))
    assert [(e.action, e.actor, e.reason, e.data["state"]) for e in entries] == [
        ("cancel", "user:ann", "wrong input", "cancelled"),
        ("requeue", "code", "", "pending"),
    ]
    assert entries[0].schedule_id == run.schedule_id
    events = [e.message for e in run.events.order_by("id")]
    assert "cancelled by user:ann: wrong input" in events


def test_a_refused_run_action_records_nothing(scheduler, make_schedule):
    make_schedule("s1")
    [run] = scheduler.tick()
    with pytest.raises(errors.InvalidStateTransition):
        scheduler.requeue_run(run.pk)
    assert not audit.entries(kind="run").exists()


def test_queue_pauses_and_resumes_are_in_the_action_log(clock):
    queues.pause_queue("reports", now=clock.now(), by="cli:ops", reason="vendor outage", source="cli")
    queues.pause_queue("reports", now=clock.now(), by="cli:ops")  # already paused: nothing
    queues.resume_queue("reports", now=clock.now(), by="user:ann", source="admin")
    queues.resume_queue("reports", now=clock.now(), by="user:ann")  # not paused: nothing
    entries = [(e.action, e.actor, e.source, e.reason) for e in audit.entries(kind="queue").order_by("id")]
    assert entries == [("pause", "cli:ops", "cli", "vendor outage"), ("resume", "user:ann", "admin", "")]


def test_limit_overrides_are_in_the_action_log_and_keep_their_limit_events(settings, clock):
    from distsched_app.models import LimitEvent

    settings.DISTSCHED = {**settings.DISTSCHED, "LIMITS": {"reports": {"queue": "reports", "concurrency": 2}}}
    limit_overrides.set_override(
        "reports", {"concurrency": 5}, now=clock.now(), by="user:ann", reason="backlog", for_seconds=60, source="api"
    )
    limit_overrides.reset_override("reports", now=clock.now(), by="cli:ops", source="cli")
    limit_overrides.set_override("reports", {"concurrency": 1}, now=clock.now(), by="code", for_seconds=60)
    clock.advance(seconds=61)
    limit_overrides.expire(clock.now())
    entries = list(audit.entries(kind="limit", target="reports").order_by("id"))
    assert [(e.action, e.actor, e.source) for e in entries] == [
        ("override", "user:ann", "api"),
        ("reset", "cli:ops", "cli"),
        ("override", "code", "code"),
        ("expired", "distsched", "system"),
    ]
    assert entries[0].data["override"] == {"concurrency": 5} and entries[0].reason == "backlog"
    assert LimitEvent.objects.count() == 4


# ---------------------------------------------------------------- retention


def test_prune_leaves_the_audit_unless_told(scheduler, make_schedule, clock):
    make_schedule("s1")
    assert len(scheduler.tick()) == 1
    assert scheduler.worker(worker_id="w", heartbeat_seconds=3600).run(burst=True, install_signals=False) == 1
    scheduler.delete_schedule("s1")
    clock.advance(days=500)
    maintenance.prune_runs(older_than=timedelta(days=30), now=clock.now())
    assert not Run.objects.exists() and AuditEntry.objects.count() == 2
    assert audit.prune_entries(older_than=timedelta(days=400), now=clock.now(), dry_run=True) == 2
    assert AuditEntry.objects.count() == 2
    assert audit.prune_entries(older_than=timedelta(days=400), now=clock.now()) == 2
    assert not AuditEntry.objects.exists()
    with pytest.raises(errors.ValidationError):
        audit.prune_entries(older_than=timedelta(0), now=clock.now())


def test_an_unknown_trigger_leaves_the_callers_transaction_usable(scheduler, make_schedule):
    make_schedule("s1")
    with transaction.atomic():
        with pytest.raises(errors.ScheduleNotFound):
            scheduler.trigger("nope")
        assert scheduler.trigger("s1").schedule_version == 1
    assert AuditEntry.objects.filter(action="trigger").count() == 1
