"""The schedules admin: list, the add/change form through the service, pause/resume/trigger, delete."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse

from distsched_app.models import AuditEntry, EventType, Origin, Run, RunEvent, Schedule
from tests.adapters.admin.pages import (
    RUNS,
    SCHEDULES,
    act,
    change_url,
    messages_of,
)
from tests.conftest import T0

pytestmark = pytest.mark.django_db


def test_schedule_changelist_shows_next_run_and_last_run_state(staff, scheduler, make_schedule):
    make_schedule("alpha", interval_seconds=60)
    make_schedule("beta", cron="0 3 * * *", timezone="Europe/Paris", paused=True)
    scheduler.tick()
    response = staff.get(SCHEDULES)
    assert response.status_code == 200
    body = response.content.decode()
    assert "alpha" in body and "beta" in body
    assert "every 60s" in body and "0 3 * * * (Europe/Paris)" in body
    assert "distsched-state-pending" in body  # alpha's last run


def test_schedule_change_page_shows_next_five_fire_times_and_recent_runs(staff, scheduler, make_schedule):
    schedule = make_schedule("five", interval_seconds=3600)
    scheduler.tick()
    response = staff.get(change_url(Schedule.objects.get(pk=schedule.pk)))
    assert response.status_code == 200
    body = response.content.decode()
    for k in range(1, 6):
        assert (T0 + timedelta(hours=k)).strftime("%Y-%m-%d %H:%M:%S") in body
    assert (T0 + timedelta(hours=6)).strftime("%Y-%m-%d %H:%M:%S") not in body
    run = Run.objects.get(schedule=schedule)
    assert change_url(run) in body
    assert f"{RUNS}?schedule=five" in body
    assert 'id="distsched-pause"' in body and 'id="distsched-trigger"' in body


def test_schedule_change_page_of_a_stored_cron_the_dialect_refuses(staff, make_schedule):
    schedule = make_schedule("old", cron="0 3 * * *")
    Schedule.objects.filter(pk=schedule.pk).update(cron="0 0 L * *")  # written before the strict dialect
    response = staff.get(change_url(schedule))
    assert response.status_code == 200
    assert "none: invalid cron expression &#x27;0 0 L * *&#x27;: day-of-month field" in response.content.decode()


def test_schedule_filters_and_search(staff, make_schedule):
    make_schedule("paused-one", paused=True)
    make_schedule("active-one", task_name="tests.echo")
    body = staff.get(SCHEDULES, {"paused__exact": "1"}).content.decode()
    assert "paused-one" in body and "active-one" not in body
    body = staff.get(SCHEDULES, {"q": "echo"}).content.decode()
    assert "active-one" in body and "paused-one" not in body


def test_pause_and_resume_actions_call_the_service(staff, make_schedule, clock):
    a, b = make_schedule("a"), make_schedule("b")
    clock.advance(seconds=5)
    assert act(staff, SCHEDULES, "pause_schedules", [a, b]) == [("success", "Paused 2 schedule(s).")]
    assert set(Schedule.objects.values_list("paused", flat=True)) == {True}
    assert Schedule.objects.get(pk=a.pk).updated_at == clock.now()
    assert act(staff, SCHEDULES, "resume_schedules", [a]) == [("success", "Resumed 1 schedule(s).")]
    assert Schedule.objects.get(pk=a.pk).paused is False
    assert Schedule.objects.get(pk=b.pk).paused is True


def test_trigger_action_creates_one_manual_run_each(staff, make_schedule, clock):
    a, b = make_schedule("a"), make_schedule("b", paused=True)
    [(level, text)] = act(staff, SCHEDULES, "trigger_schedules", [a, b])
    assert level == "success" and text.startswith("Triggered 2 schedule(s): run")
    runs = Run.objects.order_by("id")
    assert [r.schedule.name for r in runs] == ["a", "b"]
    assert {r.origin for r in runs} == {Origin.MANUAL}
    assert {r.scheduled_for for r in runs} == {clock.now()}
    created = RunEvent.objects.get(run=runs[0], event_type=EventType.CREATED)
    assert created.message == "triggered by user:admin"


def test_schedule_buttons_pause_resume_trigger(staff, make_schedule):
    schedule = make_schedule("button")
    base = change_url(schedule).removesuffix("change/")
    assert staff.get(base + "pause/").status_code == 405
    response = staff.post(base + "pause/")
    assert response.status_code == 302 and response["Location"] == change_url(schedule)
    assert Schedule.objects.get(pk=schedule.pk).paused
    assert 'id="distsched-resume"' in staff.get(change_url(schedule)).content.decode()
    staff.post(base + "resume/", follow=True)
    assert not Schedule.objects.get(pk=schedule.pk).paused
    response = staff.post(base + "trigger/", follow=True)
    assert messages_of(response)[0][1].startswith("Triggered 1 schedule(s)")
    assert Run.objects.filter(schedule=schedule, origin=Origin.MANUAL).count() == 1


def schedule_form(**overrides) -> dict:
    data = {
        "name": "new-one",
        "task_name": "tests.noop",
        "args": "[]",
        "kwargs": "{}",
        "kind": "",
        "interval_seconds": "",
        "cron": "",
        "timezone": "UTC",
        "run_at_0": "",
        "run_at_1": "",
        "start_at_0": "",
        "start_at_1": "",
        "queue": "default",
        "max_attempts": "3",
        "retry_base_seconds": "10",
        "retry_max_seconds": "3600",
        "retry_jitter": "0",
        "catch_up": "one",
        "overlap": "allow",
    }
    data.update(overrides)
    return data


def test_add_page_loads_and_creates_through_the_service(staff, clock):
    assert staff.get(reverse("admin:distsched_app_schedule_add")).status_code == 200
    response = staff.post(
        reverse("admin:distsched_app_schedule_add"), schedule_form(interval_seconds="300", kwargs='{"n": 1}')
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    schedule = Schedule.objects.get(name="new-one")
    assert schedule.kind == "interval" and schedule.interval_seconds == 300  # kind inferred by the service
    assert schedule.next_run_at == clock.now() and schedule.created_at == clock.now()
    assert schedule.kwargs == {"n": 1}


def test_add_page_accepts_overlap_replace(staff, clock):
    response = staff.post(
        reverse("admin:distsched_app_schedule_add"), schedule_form(interval_seconds="300", overlap="replace")
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    assert Schedule.objects.get(name="new-one").overlap == "replace"


@pytest.mark.parametrize(
    ("overrides", "field", "text"),
    [
        ({"cron": "61 * * * *"}, "cron", "cron"),
        ({"interval_seconds": "60", "cron": "* * * * *"}, "kind", "exactly one"),
        ({"interval_seconds": "60", "timezone": "Mars/Olympus"}, "timezone", "Mars/Olympus"),
        ({"run_at_0": "2026-03-01", "run_at_1": "08:00:00"}, "run_at", "in the past"),
        ({"interval_seconds": "60", "args": '{"a": 1}'}, "args", "args must be a JSON"),
        (
            {"interval_seconds": "60", "retry_base_seconds": "100", "retry_max_seconds": "10"},
            "retry_max_seconds",
            "at least",
        ),
        ({"interval_seconds": "60", "queue": "bad queue!"}, "queue", "queue"),
    ],
)
def test_add_form_shows_service_validation_errors_on_fields(staff, overrides, field, text):
    response = staff.post(reverse("admin:distsched_app_schedule_add"), schedule_form(**overrides))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert field in errors and text in " ".join(errors[field]), errors
    assert not Schedule.objects.exists()


def test_add_form_rejects_a_duplicate_name(staff, make_schedule):
    make_schedule("new-one")
    response = staff.post(reverse("admin:distsched_app_schedule_add"), schedule_form(interval_seconds="60"))
    assert response.status_code == 200
    assert "name" in response.context["adminform"].form.errors
    assert Schedule.objects.count() == 1


def edit(staff, schedule: Schedule, **overrides):
    schedule.refresh_from_db()
    data = schedule_form(
        name=schedule.name,
        task_name=schedule.task_name,
        kind=schedule.kind,
        interval_seconds=str(schedule.interval_seconds or ""),
        cron=schedule.cron,
        timezone=schedule.timezone,
        queue=schedule.queue,
        max_attempts=str(schedule.max_attempts),
        retry_base_seconds=str(schedule.retry_base_seconds),
        retry_max_seconds=str(schedule.retry_max_seconds),
    )
    if schedule.paused:
        data["paused"] = "on"
    data.update(overrides)
    return staff.post(change_url(schedule), data)


def test_change_recurrence_recomputes_next_run_at_via_update_schedule(staff, make_schedule, clock):
    schedule = make_schedule("edit", interval_seconds=60)
    clock.advance(seconds=30)
    response = edit(staff, schedule, interval_seconds="600")
    assert response.status_code == 302, response.content.decode()[:3000]
    schedule.refresh_from_db()
    assert schedule.interval_seconds == 600
    assert schedule.next_run_at == clock.now()  # the recurrence changed: restarts from now
    assert schedule.updated_at == clock.now()


def test_change_without_recurrence_change_keeps_next_run_at(staff, make_schedule, clock):
    schedule = make_schedule("keep", interval_seconds=60)
    before = schedule.next_run_at
    clock.advance(seconds=30)
    assert edit(staff, schedule, queue="other", max_attempts="7").status_code == 302
    schedule.refresh_from_db()
    assert (schedule.queue, schedule.max_attempts, schedule.next_run_at) == ("other", 7, before)


def test_change_to_an_invalid_cron_is_a_form_error_and_writes_nothing(staff, make_schedule):
    schedule = make_schedule("cronny", cron="0 3 * * *")
    response = edit(staff, schedule, cron="not a cron")
    assert response.status_code == 200
    assert "cron" in response.context["adminform"].form.errors
    schedule.refresh_from_db()
    assert schedule.cron == "0 3 * * *"


def test_service_refusal_after_validation_is_reported_not_a_500(staff, make_schedule, monkeypatch):
    from distsched_app import errors
    from distsched_app.services import schedules

    schedule = make_schedule("race")

    def vanished(name, **changes):
        raise errors.ScheduleNotFound(f"no schedule named {name!r}")

    monkeypatch.setattr(schedules, "update_schedule", vanished)
    response = edit(staff, schedule, interval_seconds="120")
    assert response.status_code == 302 and response["Location"] == change_url(schedule)
    assert messages_of(response) == [("error", "Not saved: no schedule named 'race'")]


def test_delete_confirmation_lists_the_schedule_only_and_deletes_through_the_service(staff, scheduler, make_schedule):
    schedule = make_schedule("gone")
    [run] = scheduler.tick()
    url = reverse("admin:distsched_app_schedule_delete", args=[schedule.pk])
    response = staff.get(url)
    assert response.status_code == 200
    assert "Schedule: gone" in response.content.decode() and "run(s)" not in response.content.decode()
    assert staff.post(url, {"post": "yes"}).status_code == 302
    assert not Schedule.objects.exists()
    kept = Run.objects.get(pk=run.pk)  # the run and its history stay, under the schedule's name
    assert (kept.deleted_schedule, kept.state) == ("gone", "cancelled")
    [entry] = AuditEntry.objects.filter(target="gone", action="delete")
    assert (entry.actor, entry.source) == ("user:admin", "admin")
