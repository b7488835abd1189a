"""Schedule lifecycle through the service layer: validation, storage, pause/resume, trigger."""

from __future__ import annotations

from datetime import timedelta

import pytest

from distsched_app import errors
from distsched_app.models import EventType, Origin, Run, RunEvent, RunState, Schedule
from tests.conftest import T0

pytestmark = pytest.mark.django_db


def test_interval_schedule_first_slot_is_creation_time(scheduler):
    s = scheduler.create_schedule(name="every-minute", task_name="tests.noop", interval_seconds=60)
    assert s.kind == "interval"
    assert s.next_run_at == T0
    assert s.catch_up == "one" and s.overlap == "allow" and s.queue == "default"
    assert s.max_attempts == 3


def test_interval_schedule_with_start_at(scheduler):
    start = T0 + timedelta(hours=2)
    s = scheduler.create_schedule(name="later", task_name="tests.noop", interval_seconds=60, start_at=start)
    assert s.next_run_at == start


def test_once_schedule_in_future(scheduler):
    at = T0 + timedelta(minutes=5)
    s = scheduler.create_schedule(name="one-off", task_name="tests.noop", run_at=at)
    assert (s.kind, s.next_run_at) == ("once", at)


def test_cron_schedule_first_match_at_or_after_creation(scheduler, clock):
    clock.set("2026-03-02T09:00:30+00:00")
    s = scheduler.create_schedule(name="nightly", task_name="tests.noop", cron="0 3 * * *", timezone="Europe/Paris")
    # 03:00 Paris (CET, UTC+1) on 3 March = 02:00 UTC.
    assert s.next_run_at.isoformat() == "2026-03-03T02:00:00+00:00"


@pytest.mark.parametrize(
    ("options", "error", "field"),
    [
        ({"interval_seconds": 0}, errors.InvalidInterval, "interval_seconds"),
        ({"interval_seconds": -5}, errors.InvalidInterval, "interval_seconds"),
        ({"interval_seconds": 1.5}, errors.InvalidInterval, "interval_seconds"),
        ({"interval_seconds": "10"}, errors.InvalidInterval, "interval_seconds"),
        ({"cron": "61 * * * *"}, errors.InvalidCron, "cron"),
        ({"cron": "not a cron"}, errors.InvalidCron, "cron"),
        ({"cron": "0 3 * * *", "timezone": "Mars/Olympus"}, errors.UnknownTimezone, "timezone"),
        ({"run_at": T0 - timedelta(seconds=1)}, errors.RunAtInPast, "run_at"),
        ({"interval_seconds": 60, "kwargs": [1, 2]}, errors.InvalidPayload, "kwargs"),
        ({"interval_seconds": 60, "args": {"a": 1}}, errors.InvalidPayload, "args"),
        ({"interval_seconds": 60, "kwargs": {"when": T0}}, errors.InvalidPayload, "kwargs"),
        ({"interval_seconds": 60, "cron": "* * * * *"}, errors.InvalidScheduleSpec, "kind"),
        ({}, errors.InvalidScheduleSpec, "kind"),
        ({"interval_seconds": 60, "max_attempts": 0}, errors.ValidationError, "max_attempts"),
        ({"interval_seconds": 60, "catch_up": "sometimes"}, errors.ValidationError, "catch_up"),
        ({"interval_seconds": 60, "overlap": "never"}, errors.ValidationError, "overlap"),
        ({"interval_seconds": 60, "queue": "no spaces"}, errors.ValidationError, "queue"),
    ],
)
def test_bad_input_is_rejected_and_nothing_is_written(scheduler, options, error, field):
    with pytest.raises(error) as info:
        scheduler.create_schedule(name="bad", task_name="tests.noop", **options)
    assert info.value.field == field
    assert Schedule.objects.count() == 0
    assert Run.objects.count() == 0


def test_unknown_task_is_rejected(scheduler):
    with pytest.raises(errors.UnknownTask) as info:
        scheduler.create_schedule(name="x", task_name="os.system", interval_seconds=60)
    assert info.value.field == "task_name"
    assert not Schedule.objects.exists()


@pytest.mark.parametrize("name", ["", "has space", "slash/name", "x" * 101, "ünïcode"])
def test_invalid_names_are_rejected(scheduler, name):
    with pytest.raises(errors.InvalidName):
        scheduler.create_schedule(name=name, task_name="tests.noop", interval_seconds=60)
    assert not Schedule.objects.exists()


def test_duplicate_name_is_a_typed_error(scheduler, make_schedule):
    make_schedule("dup")
    with pytest.raises(errors.DuplicateName) as info:
        make_schedule("dup")
    assert info.value.field == "name"
    assert Schedule.objects.count() == 1


def test_payload_size_limit(scheduler, settings):
    settings.DISTSCHED = {"MAX_PAYLOAD_BYTES": 100}
    with pytest.raises(errors.InvalidPayload, match="larger than 100 bytes"):
        scheduler.create_schedule(name="big", task_name="tests.noop", interval_seconds=60, kwargs={"blob": "x" * 200})
    assert not Schedule.objects.exists()


def test_deeply_nested_payload_is_rejected(scheduler):
    nested: list = []
    for _ in range(100):
        nested = [nested]
    with pytest.raises(errors.InvalidPayload, match="nested deeper"):
        scheduler.create_schedule(name="deep", task_name="tests.noop", interval_seconds=60, args=nested)


def test_pause_and_resume_keep_next_run_at(scheduler, make_schedule):
    make_schedule("p")
    paused = scheduler.pause("p")
    assert paused.paused
    resumed = scheduler.resume("p")
    assert not resumed.paused
    assert resumed.next_run_at == T0


def test_unknown_schedule_name(scheduler):
    with pytest.raises(errors.ScheduleNotFound):
        scheduler.pause("nope")
    with pytest.raises(errors.ScheduleNotFound):
        scheduler.get_schedule("nope")


def test_trigger_creates_one_manual_run_now(scheduler, make_schedule, clock):
    make_schedule("t", interval_seconds=3600, start_at=T0 + timedelta(days=1))
    clock.advance(seconds=30)
    run = scheduler.trigger("t")
    run.refresh_from_db()
    assert run.origin == Origin.MANUAL
    assert run.state == RunState.PENDING
    assert run.scheduled_for == clock.now()
    assert run.idempotency_key == f"manual:{run.pk}"
    assert list(RunEvent.objects.filter(run=run).values_list("event_type", flat=True)) == [EventType.CREATED]


def test_two_triggers_in_the_same_instant_are_both_kept(scheduler, make_schedule):
    make_schedule("t")
    a, b = scheduler.trigger("t"), scheduler.trigger("t")
    assert a.pk != b.pk
    assert Run.objects.filter(origin=Origin.MANUAL).count() == 2


def test_update_interval_restarts_from_now(scheduler, make_schedule, clock):
    make_schedule("u", interval_seconds=60)
    clock.advance(seconds=10)
    s = scheduler.update_schedule("u", interval_seconds=300)
    assert s.interval_seconds == 300
    assert s.next_run_at == clock.now()


def test_update_switches_kind_to_cron(scheduler, make_schedule):
    make_schedule("u", interval_seconds=60)
    s = scheduler.update_schedule("u", cron="*/5 * * * *")
    assert s.kind == "cron" and s.interval_seconds is None
    assert s.next_run_at == T0  # 09:00 matches */5


def test_overlap_accepts_every_policy(scheduler, make_schedule):
    assert make_schedule("o", overlap="replace").overlap == "replace"
    assert scheduler.update_schedule("o", overlap="skip").overlap == "skip"
    assert scheduler.update_schedule("o", overlap="replace").overlap == "replace"
    with pytest.raises(errors.ValidationError, match="overlap must be one of allow, skip, replace"):
        scheduler.update_schedule("o", overlap="newest")
    assert Schedule.objects.get(name="o").overlap == "replace"


def test_invalid_update_changes_nothing(scheduler, make_schedule):
    make_schedule("u", interval_seconds=60)
    with pytest.raises(errors.InvalidInterval):
        scheduler.update_schedule("u", interval_seconds=0)
    assert Schedule.objects.get(name="u").interval_seconds == 60


def test_update_unknown_field_rejected(scheduler, make_schedule):
    make_schedule("u")
    with pytest.raises(errors.ValidationError):
        scheduler.update_schedule("u", next_run_at=T0)


def test_delete_keeps_the_runs_and_their_history_under_the_schedules_name(scheduler, make_schedule):
    make_schedule("d")
    [run] = scheduler.tick()
    assert scheduler.delete_schedule("d") == 1
    assert not Schedule.objects.exists()
    kept = Run.objects.get(pk=run.pk)
    assert (kept.schedule_id, kept.deleted_schedule, kept.state) == (None, "d", RunState.CANCELLED)
    assert [e.event_type for e in RunEvent.objects.filter(run=kept)] == [EventType.CREATED, EventType.CANCELLED]
    assert RunEvent.objects.get(run=kept, event_type=EventType.CANCELLED).message == (
        "cancelled with its schedule d (deleted by code)"
    )
    assert scheduler.get_run(run.pk).schedule is None


def test_delete_asks_a_running_run_to_stop_and_keeps_the_worker_on_it(scheduler, make_schedule, clock):
    from distsched_app.models import Worker
    from distsched_app.services import claiming, workers

    make_schedule("d2")
    make_schedule("keep")
    scheduler.tick()
    run = claiming.claim_next_run(worker_id="w", queues=None, lease_seconds=30, now=clock.now())
    workers.register_worker(worker_id="w", hostname="h", pid=1, queues=[], now=clock.now())
    workers.heartbeat(worker_id="w", now=clock.now(), current_run_id=run.pk)
    name = run.schedule.name
    scheduler.delete_schedule(name)
    kept = Run.objects.get(pk=run.pk)
    assert (kept.state, kept.cancel_requested, kept.deleted_schedule) == (RunState.RUNNING, True, name)
    assert Worker.objects.get(worker_id="w").current_run_id == run.pk
    assert Run.objects.count() == 2  # the other schedule's too


@pytest.mark.parametrize("name", ["bad\x00name", 42, None])
def test_impossible_names_are_not_found(scheduler, name):
    with pytest.raises(errors.ScheduleNotFound):
        scheduler.get_schedule(name)
    with pytest.raises(errors.ScheduleNotFound):
        scheduler.pause(name)


def test_far_future_dates_are_rejected(scheduler):
    from datetime import datetime, timezone

    with pytest.raises(errors.ValidationError) as info:
        scheduler.create_schedule(name="far", task_name="tests.noop", run_at=datetime(9500, 1, 1, tzinfo=timezone.utc))
    assert info.value.field == "run_at"
