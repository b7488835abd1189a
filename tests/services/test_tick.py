"""The tick: due schedules become runs, exactly once per slot, per catch-up and overlap policy."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection

from distsched_app.models import EventType, Run, RunEvent, RunState, Schedule
from tests.conftest import T0

pytestmark = pytest.mark.django_db


def slots(name: str) -> list:
    return list(
        Run.objects.filter(schedule__name=name).order_by("scheduled_for").values_list("scheduled_for", flat=True)
    )


def test_once_schedule_due_now_creates_one_run(scheduler, clock):
    scheduler.create_schedule(name="now", task_name="tests.noop", run_at=T0)
    created = scheduler.tick()
    assert len(created) == 1
    run = created[0]
    assert (run.state, run.scheduled_for, run.idempotency_key) == (RunState.PENDING, T0, f"now:{T0.isoformat()}")
    assert Schedule.objects.get(name="now").next_run_at is None
    clock.advance(seconds=3600)
    assert scheduler.tick() == []


def test_once_schedule_in_future_waits(scheduler, clock):
    scheduler.create_schedule(name="later", task_name="tests.noop", run_at=T0 + timedelta(minutes=10))
    assert scheduler.tick() == []
    clock.advance(minutes=9, seconds=59)
    assert scheduler.tick() == []
    clock.advance(seconds=1)
    assert len(scheduler.tick()) == 1


def test_interval_advances_from_previous_slot_without_drift(scheduler, make_schedule, clock):
    make_schedule("i", interval_seconds=60)
    scheduler.tick()
    # Tick late each time: slots stay on the T0 grid, not on tick times.
    for late in (7, 59, 1):
        clock.set(Schedule.objects.get(name="i").next_run_at + timedelta(seconds=late))
        scheduler.tick()
    assert slots("i") == [T0 + timedelta(seconds=60 * k) for k in range(4)]
    assert Schedule.objects.get(name="i").next_run_at == T0 + timedelta(seconds=240)


def test_tick_records_created_event(scheduler, make_schedule):
    make_schedule("e")
    [run] = scheduler.tick()
    assert list(RunEvent.objects.filter(run=run).values_list("event_type", flat=True)) == [EventType.CREATED]


def test_paused_schedule_creates_nothing(scheduler, make_schedule, clock):
    make_schedule("p")
    scheduler.pause("p")
    clock.advance(hours=3)
    assert scheduler.tick() == []
    assert not Run.objects.exists()


def test_resume_after_long_pause_does_not_flood(scheduler, make_schedule, clock):
    make_schedule("r", interval_seconds=60)  # catch_up "one" by default
    scheduler.pause("r")
    clock.advance(hours=5)
    scheduler.resume("r")
    created = scheduler.tick()
    assert len(created) == 1
    assert created[0].scheduled_for == clock.now()  # the most recent slot
    assert Schedule.objects.get(name="r").next_run_at == clock.now() + timedelta(seconds=60)


def test_catch_up_one_after_outage(scheduler, make_schedule, clock):
    make_schedule("one", interval_seconds=600, catch_up="one")
    clock.advance(seconds=3600 + 30)  # slots T0, +10m, ... +60m missed: 7 slots
    [run] = scheduler.tick()
    assert run.scheduled_for == T0 + timedelta(seconds=3600)
    created = RunEvent.objects.get(run=run, event_type=EventType.CREATED)
    assert "6 missed slot(s)" in created.message
    assert Schedule.objects.get(name="one").next_run_at == T0 + timedelta(seconds=4200)


def test_catch_up_all_after_outage_is_capped(scheduler, make_schedule, clock, settings):
    settings.DISTSCHED = {"MAX_CATCH_UP": 5}
    make_schedule("all", interval_seconds=600, catch_up="all")
    clock.advance(seconds=3600 + 30)  # 7 slots due
    created = scheduler.tick()
    assert [r.scheduled_for for r in created] == [T0 + timedelta(seconds=600 * k) for k in range(2, 7)]
    first = RunEvent.objects.get(run=created[0], event_type=EventType.CREATED)
    assert "2 missed slot(s)" in first.message


def test_catch_up_all_within_cap_creates_every_slot(scheduler, make_schedule, clock):
    make_schedule("all", interval_seconds=600, catch_up="all")
    clock.advance(seconds=1800)
    assert len(scheduler.tick()) == 4  # T0, +10, +20, +30 min


def test_catch_up_skip_drops_a_long_outage(scheduler, make_schedule, clock):
    make_schedule("skip", interval_seconds=600, catch_up="skip")
    clock.advance(seconds=3600 + 120)  # most recent slot is 120 s old: beyond the 60 s grace
    assert scheduler.tick() == []
    assert Schedule.objects.get(name="skip").next_run_at == T0 + timedelta(seconds=4200)


def test_catch_up_skip_keeps_a_slot_within_grace(scheduler, make_schedule, clock):
    make_schedule("skip", interval_seconds=600, catch_up="skip")
    clock.advance(seconds=3600 + 30)
    [run] = scheduler.tick()
    assert run.scheduled_for == T0 + timedelta(seconds=3600)


def test_overlap_skip_records_skipped_slot_while_previous_active(scheduler, make_schedule, clock):
    make_schedule("o", interval_seconds=60, overlap="skip")
    [first] = scheduler.tick()
    clock.advance(seconds=60)
    [second] = scheduler.tick()
    assert second.state == RunState.SKIPPED
    assert second.finished_at == clock.now()
    skipped = RunEvent.objects.get(run=second, event_type=EventType.SKIPPED)
    assert "still active" in skipped.message
    # Once the first run is terminal, the next slot is runnable again.
    Run.objects.filter(pk=first.pk).update(state=RunState.SUCCEEDED)
    clock.advance(seconds=60)
    [third] = scheduler.tick()
    assert third.state == RunState.PENDING


def test_overlap_allow_creates_runnable_runs(scheduler, make_schedule, clock):
    make_schedule("a", interval_seconds=60)
    scheduler.tick()
    clock.advance(seconds=60)
    [second] = scheduler.tick()
    assert second.state == RunState.PENDING


def test_repeated_ticks_never_duplicate_a_slot(scheduler, make_schedule, clock):
    make_schedule("d", interval_seconds=60)
    for _ in range(5):
        scheduler.tick()
    assert Run.objects.count() == 1


def test_slot_that_already_has_a_run_is_not_duplicated(scheduler, make_schedule):
    make_schedule("back", interval_seconds=60)
    scheduler.tick()
    # An operator moves next_run_at back onto an existing slot: the unique constraint decides.
    Schedule.objects.filter(name="back").update(next_run_at=T0)
    assert scheduler.tick() == []
    assert Run.objects.count() == 1


def test_tick_processes_more_schedules_than_one_batch(scheduler, clock, settings):
    settings.DISTSCHED = {"TICK_BATCH_SIZE": 3}
    for i in range(8):
        scheduler.create_schedule(name=f"b{i}", task_name="tests.noop", interval_seconds=60)
    assert len(scheduler.tick()) == 8


def test_cron_schedule_ticks_on_its_slots(scheduler, clock):
    scheduler.create_schedule(name="c", task_name="tests.noop", cron="*/15 * * * *")
    clock.advance(minutes=31)
    [run] = scheduler.tick()  # catch-up one: most recent slot 09:30
    assert run.scheduled_for == T0 + timedelta(minutes=30)
    assert Schedule.objects.get(name="c").next_run_at == T0 + timedelta(minutes=45)


@pytest.mark.parametrize("planner", ["default", "hash-join"])
def test_run_ids_follow_the_ticks_slot_order(scheduler, clock, planner):
    """Runs are claimed by (available_at, id): equal-time runs must get ids in
    slot order whatever join the database picks for the insert (a hash join
    over the schedule table returns rows in their order on disk)."""
    for i in range(60):
        scheduler.create_schedule(name=f"o{i:02d}", task_name="tests.noop", interval_seconds=3600)
    for i in range(240):
        scheduler.create_schedule(name=f"p{i:03d}", task_name="tests.noop", interval_seconds=3600, paused=True)
    # Slots in the reverse order of creation (and of the rows on disk), three per slot.
    for i, schedule in enumerate(Schedule.objects.filter(paused=False).order_by("id")):
        Schedule.objects.filter(pk=schedule.pk).update(next_run_at=T0 - timedelta(seconds=i // 3))
    if planner == "hash-join":
        if connection.vendor != "postgresql":
            pytest.skip("PostgreSQL-only: planner settings")
        with connection.cursor() as cursor:  # SET LOCAL is undone by the test's rollback
            cursor.execute(f"ANALYZE {Schedule._meta.db_table}")
            cursor.execute("SET LOCAL enable_nestloop = off")
            cursor.execute("SET LOCAL enable_mergejoin = off")
    assert len(scheduler.tick()) == 60
    by_id = list(Run.objects.order_by("id").values_list("scheduled_for", "schedule_id"))
    assert by_id == sorted(by_id)


def test_due_schedule_row_matches_the_selected_columns(scheduler):
    """The tick builds DueSchedule(*row) from values_list(*TICK_FIELDS): every
    column is a Schedule column and lands in the attribute of the same name."""
    from distsched_app.services.tick import TICK_FIELDS, DueSchedule

    model_fields = {f.name for f in Schedule._meta.get_fields()}
    assert set(TICK_FIELDS) <= model_fields
    scheduler.create_schedule(name="row", task_name="tests.noop", cron="0 9 * * *", timezone="Europe/Paris")
    schedule = Schedule.objects.get(name="row")
    [row] = Schedule.objects.filter(pk=schedule.pk).values_list(*TICK_FIELDS)
    due = DueSchedule(*row)
    assert {name: getattr(due, name) for name in TICK_FIELDS} == {name: getattr(schedule, name) for name in TICK_FIELDS}


def test_tick_inserts_more_runs_than_one_insert_chunk(scheduler, clock, monkeypatch):
    """SQLite splits a batch's insert into chunks (its bound-variable limit); none is lost or doubled."""
    from distsched_app.db import bulk

    monkeypatch.setattr(bulk, "ROWS_PER_STATEMENT", 4)
    for i in range(10):
        scheduler.create_schedule(name=f"k{i}", task_name="tests.noop", interval_seconds=60)
    created = scheduler.tick()
    assert len(created) == 10
    assert sorted(r.pk for r in created) == list(Run.objects.order_by("id").values_list("id", flat=True))
    assert RunEvent.objects.filter(event_type=EventType.CREATED).count() == 10


@pytest.mark.parametrize(
    ("stored", "fix"),
    [
        ({"cron": "0 R * * *"}, {"cron": "*/15 * * * *"}),
        ({"cron": "0 0 L * *"}, {"cron": "*/15 * * * *"}),
        ({"timezone": "Mars/Olympus"}, {"timezone": "UTC"}),
    ],
)
def test_a_stored_recurrence_that_no_longer_validates_is_skipped_and_the_others_tick(
    scheduler, clock, caplog, stored, fix
):
    """A row the validation now refuses (a croniter extension stored before the strict
    dialect, or anything written by SQL) must not stop the tick for every schedule."""
    scheduler.create_schedule(name="a-good", task_name="tests.noop", interval_seconds=60)
    scheduler.create_schedule(name="b-bad", task_name="tests.noop", cron="*/15 * * * *")
    scheduler.create_schedule(name="c-good", task_name="tests.noop", cron="*/15 * * * *")
    Schedule.objects.filter(name="b-bad").update(**stored)
    stuck_at = Schedule.objects.get(name="b-bad").next_run_at
    clock.advance(minutes=16)
    with caplog.at_level("ERROR", logger="distsched"):
        created = scheduler.tick()
    assert sorted(run.schedule.name for run in created) == ["a-good", "c-good"]
    assert not Run.objects.filter(schedule__name="b-bad").exists()
    assert Schedule.objects.get(name="b-bad").next_run_at == stuck_at
    [record] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert record.getMessage() == "schedule skipped: invalid recurrence"
    assert record.distsched["schedule"] == "b-bad"
    assert ("invalid cron expression" if "cron" in stored else "unknown time zone") in record.distsched["error"]
    # It stays due, so the overdue figures (stats, metrics, dashboard) report it.
    assert scheduler.stats().schedules_overdue == 1
    clock.advance(minutes=15)
    assert sorted(run.schedule.name for run in scheduler.tick()) == ["a-good", "c-good"]
    # Fixing the row through the service puts it back on its slots.
    scheduler.update_schedule("b-bad", **fix)
    clock.advance(minutes=15)
    assert sorted(run.schedule.name for run in scheduler.tick()) == ["a-good", "b-bad", "c-good"]
    assert scheduler.stats().schedules_overdue == 0
