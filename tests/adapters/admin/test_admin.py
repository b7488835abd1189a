"""The Django admin: pages load, actions call the services and report, nothing is hand-editable."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from distsched_app.admin import support as admin_support
from distsched_app.models import EventType, Origin, Run, RunEvent, RunState, Schedule, Worker, WorkerStatus
from distsched_app.services import claiming, workers
from tests.conftest import T0

pytestmark = pytest.mark.django_db

SCHEDULES = reverse("admin:distsched_app_schedule_changelist")
RUNS = reverse("admin:distsched_app_run_changelist")
WORKERS = reverse("admin:distsched_app_worker_changelist")
EVENTS = reverse("admin:distsched_app_runevent_changelist")


@pytest.fixture
def staff(admin_client, clock, monkeypatch):
    """A superuser's client; the admin reads the same FakeClock as the services."""
    return admin_client


def change_url(obj) -> str:
    return reverse(f"admin:distsched_app_{obj._meta.model_name}_change", args=[obj.pk])


def messages_of(response) -> list[tuple[str, str]]:
    """The messages shown by a followed redirect, or queued by a response that was not followed."""
    found = response.context["messages"] if response.context else get_messages(response.wsgi_request)
    return [(m.level_tag, str(m)) for m in found]


def act(client, url: str, action: str, objs) -> list[tuple[str, str]]:
    response = client.post(url, {"action": action, "_selected_action": [o.pk for o in objs]}, follow=True)
    assert response.redirect_chain and response.status_code == 200, response.content[:500]
    return messages_of(response)


def pending_run(scheduler, make_schedule, name: str = "p", **options) -> Run:
    make_schedule(name, **options)
    [run] = [r for r in scheduler.tick() if r.schedule.name == name]
    return run


def dead_run(scheduler, make_schedule, name: str = "d") -> Run:
    make_schedule(name, task_name="tests.fail", max_attempts=1, kwargs={"message": "kaboom: disk full"})
    scheduler.tick()
    scheduler.worker(worker_id="w-dead", lease_seconds=30, heartbeat_seconds=3600).run_once()
    run = Run.objects.get(schedule__name=name)
    assert run.state == RunState.DEAD
    return run


def running_run(scheduler, make_schedule, clock, name: str = "r") -> Run:
    run = pending_run(scheduler, make_schedule, name)
    claimed = claiming.claim_next_run(worker_id="w-run", queues=None, lease_seconds=30, now=clock.now())
    assert claimed.pk == run.pk
    return claimed


# --------------------------------------------------------------------------
# Schedules


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
    assert created.message == "triggered by admin:admin"


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
        "name": "new-one", "task_name": "tests.noop", "args": "[]", "kwargs": "{}", "kind": "",
        "interval_seconds": "", "cron": "", "timezone": "UTC", "run_at_0": "", "run_at_1": "",
        "start_at_0": "", "start_at_1": "", "queue": "default", "max_attempts": "3",
        "retry_base_seconds": "10", "retry_max_seconds": "3600", "retry_jitter": "0",
        "catch_up": "one", "overlap": "allow",
    }
    data.update(overrides)
    return data


def test_add_page_loads_and_creates_through_the_service(staff, clock):
    assert staff.get(reverse("admin:distsched_app_schedule_add")).status_code == 200
    response = staff.post(reverse("admin:distsched_app_schedule_add"),
                          schedule_form(interval_seconds="300", kwargs='{"n": 1}'))
    assert response.status_code == 302, response.content.decode()[:3000]
    schedule = Schedule.objects.get(name="new-one")
    assert schedule.kind == "interval" and schedule.interval_seconds == 300  # kind inferred by the service
    assert schedule.next_run_at == clock.now() and schedule.created_at == clock.now()
    assert schedule.kwargs == {"n": 1}


@pytest.mark.parametrize(
    ("overrides", "field", "text"),
    [
        ({"cron": "61 * * * *"}, "cron", "cron"),
        ({"interval_seconds": "60", "cron": "* * * * *"}, "kind", "exactly one"),
        ({"interval_seconds": "60", "timezone": "Mars/Olympus"}, "timezone", "Mars/Olympus"),
        ({"run_at_0": "2026-03-01", "run_at_1": "08:00:00"}, "run_at", "in the past"),
        ({"interval_seconds": "60", "args": '{"a": 1}'}, "args", "args must be a JSON"),
        ({"interval_seconds": "60", "retry_base_seconds": "100", "retry_max_seconds": "10"},
         "retry_max_seconds", "at least"),
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
        name=schedule.name, task_name=schedule.task_name, kind=schedule.kind,
        interval_seconds=str(schedule.interval_seconds or ""), cron=schedule.cron, timezone=schedule.timezone,
        queue=schedule.queue, max_attempts=str(schedule.max_attempts),
        retry_base_seconds=str(schedule.retry_base_seconds), retry_max_seconds=str(schedule.retry_max_seconds),
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


def test_delete_confirmation_summarises_runs_and_deletes_through_the_service(staff, scheduler, make_schedule):
    schedule = make_schedule("gone")
    scheduler.tick()
    url = reverse("admin:distsched_app_schedule_delete", args=[schedule.pk])
    response = staff.get(url)
    assert response.status_code == 200
    assert "1 run(s) of this schedule" in response.content.decode()
    assert staff.post(url, {"post": "yes"}).status_code == 302
    assert not Schedule.objects.exists() and not Run.objects.exists()


# --------------------------------------------------------------------------
# Runs


def test_run_changelist_and_change_page_load(staff, scheduler, make_schedule):
    run = dead_run(scheduler, make_schedule)
    response = staff.get(RUNS)
    assert response.status_code == 200
    assert "distsched-state-dead" in response.content.decode()
    response = staff.get(change_url(run))
    assert response.status_code == 200
    body = response.content.decode()
    assert "kaboom: disk full" in body and "Traceback" in body
    assert 'id="distsched-requeue"' in body and 'id="distsched-cancel"' not in body
    assert 'name="_save"' not in body  # state machinery is not hand-editable


def test_run_change_page_lists_events_in_order(staff, scheduler, make_schedule):
    run = dead_run(scheduler, make_schedule)
    formset = response_inline(staff.get(change_url(run)))
    assert [f.instance.event_type for f in formset] == ["created", "claimed", "started", "failed", "marked_dead"]


def response_inline(response):
    [inline] = response.context["inline_admin_formsets"]
    return inline.formset


def test_runs_cannot_be_added_edited_or_deleted_by_hand(staff, scheduler, make_schedule):
    run = pending_run(scheduler, make_schedule)
    assert staff.get(reverse("admin:distsched_app_run_add")).status_code == 403
    assert staff.post(change_url(run), {"state": "succeeded"}).status_code == 403
    assert staff.get(reverse("admin:distsched_app_run_delete", args=[run.pk])).status_code == 403
    assert Run.objects.get(pk=run.pk).state == RunState.PENDING


def test_cancel_action_pending_and_running(staff, scheduler, make_schedule, clock):
    running = running_run(scheduler, make_schedule, clock, "r")
    pending = pending_run(scheduler, make_schedule, "p")
    assert act(staff, RUNS, "cancel_runs", [pending, running]) == [
        ("success", "Cancelled 1 run(s)."),
        ("success", "Asked 1 running run(s) to stop: their tasks see context.cancel_requested()."),
    ]
    pending.refresh_from_db()
    running.refresh_from_db()
    assert pending.state == RunState.CANCELLED and pending.finished_at == clock.now()
    assert running.state == RunState.RUNNING and running.cancel_requested
    assert RunEvent.objects.get(run=pending, event_type=EventType.CANCELLED).message == "cancelled by admin:admin"


def test_cancel_action_on_a_finished_run_is_a_warning_not_an_error(staff, scheduler, make_schedule):
    dead = dead_run(scheduler, make_schedule)
    pending = pending_run(scheduler, make_schedule, "p")
    msgs = act(staff, RUNS, "cancel_runs", [dead, pending])
    assert msgs[0] == ("warning", f"1 run(s) not cancelled: run {dead.pk} is dead; only pending, retrying, "
                                  "leased or running runs can be cancelled")
    assert msgs[1] == ("success", "Cancelled 1 run(s).")
    assert Run.objects.get(pk=dead.pk).state == RunState.DEAD


def test_requeue_action_dead_run_goes_pending(staff, scheduler, make_schedule, clock):
    dead = dead_run(scheduler, make_schedule)
    clock.advance(seconds=90)
    assert act(staff, RUNS, "requeue_runs", [dead]) == [("success", "Requeued 1 run(s): pending now.")]
    dead.refresh_from_db()
    assert dead.state == RunState.PENDING and dead.available_at == clock.now()
    assert dead.attempts == 1 and dead.max_attempts == 2


def test_requeue_action_refuses_runs_whose_state_forbids_it(staff, scheduler, make_schedule):
    pending = pending_run(scheduler, make_schedule)
    assert act(staff, RUNS, "requeue_runs", [pending]) == [
        ("warning", f"1 run(s) not requeued: run {pending.pk} is pending; only dead or cancelled runs can be "
                    "requeued"),
    ]
    assert Run.objects.get(pk=pending.pk).state == RunState.PENDING


def test_requeue_and_cancel_buttons_on_the_change_page(staff, scheduler, make_schedule):
    dead = dead_run(scheduler, make_schedule)
    base = change_url(dead).removesuffix("change/")
    assert staff.get(base + "requeue/").status_code == 405
    response = staff.post(base + "requeue/")
    assert response.status_code == 302 and response["Location"] == change_url(dead)
    assert Run.objects.get(pk=dead.pk).state == RunState.PENDING
    assert 'id="distsched-cancel"' in staff.get(change_url(dead)).content.decode()
    staff.post(base + "cancel/", follow=True)
    assert Run.objects.get(pk=dead.pk).state == RunState.CANCELLED
    response = staff.post(base + "cancel/", follow=True)  # no longer allowed: a warning, not a 500
    assert response.status_code == 200
    assert [level for level, _ in messages_of(response)] == ["warning"]


def test_actions_need_the_change_permission(client, django_user_model, scheduler, make_schedule):
    from django.contrib.auth.models import Permission

    dead = dead_run(scheduler, make_schedule)
    viewer = django_user_model.objects.create_user("viewer", password="x", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_run"))
    client.force_login(viewer)
    body = client.get(RUNS).content.decode()
    assert "requeue_runs" not in body
    assert 'id="distsched-requeue"' not in client.get(change_url(dead)).content.decode()
    assert client.post(change_url(dead).removesuffix("change/") + "requeue/").status_code == 403
    assert Run.objects.get(pk=dead.pk).state == RunState.DEAD


def test_an_oversized_selection_is_refused(staff, scheduler, make_schedule, monkeypatch):
    monkeypatch.setattr(admin_support, "MAX_ACTION_ROWS", 1)
    a, b = pending_run(scheduler, make_schedule, "a"), pending_run(scheduler, make_schedule, "b")
    [(level, text)] = act(staff, RUNS, "cancel_runs", [a, b])
    assert level == "warning" and text.startswith("Select at most 1 rows")
    assert set(Run.objects.values_list("state", flat=True)) == {RunState.PENDING}


@pytest.fixture
def assorted(scheduler, make_schedule, clock):
    dead = dead_run(scheduler, make_schedule, "dies")
    other = pending_run(scheduler, make_schedule, "other", task_name="tests.echo", queue="slow")
    manual = scheduler.trigger("other")
    return {"dead": dead, "other": other, "manual": manual}


def ids_listed(response) -> set[int]:
    return {obj.pk for obj in response.context["cl"].result_list}


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, {"dead", "other", "manual"}),
        ({"state": "dead"}, {"dead"}),
        ({"state": "pending"}, {"other", "manual"}),
        ({"task_name": "tests.fail"}, {"dead"}),
        ({"queue": "slow"}, {"other", "manual"}),
        ({"schedule": "other"}, {"other", "manual"}),
        ({"schedule": "other", "origin": "manual"}, {"manual"}),
        ({"q": "disk full"}, {"dead"}),
        ({"q": "other:"}, {"other"}),
        ({"q": "manual:"}, {"manual"}),
        ({"schedule": "no-such-schedule"}, set()),
    ],
)
def test_run_filters_and_search(staff, assorted, params, expected):
    response = staff.get(RUNS, params)
    assert response.status_code == 200
    assert ids_listed(response) == {assorted[k].pk for k in expected}


def test_run_search_by_id(staff, assorted):
    run = assorted["other"]
    assert ids_listed(staff.get(RUNS, {"q": f"#{run.pk}"})) == {run.pk}  # "#N": the id only
    assert run.pk in ids_listed(staff.get(RUNS, {"q": str(run.pk)}))  # "N": the id, or N in a key or an error


@pytest.mark.parametrize("term", ["#99999999999999999999", "99999999999999999999", "#x", "#"])
def test_run_search_with_odd_ids_is_not_an_error(staff, assorted, term):
    response = staff.get(RUNS, {"q": term})
    assert response.status_code == 200 and ids_listed(response) == set()
    assert staff.get(EVENTS, {"q": term}).status_code == 200


def test_object_buttons_on_missing_or_malformed_ids_are_404(staff):
    assert staff.post(RUNS + "abc/requeue/").status_code == 404
    assert staff.post(RUNS + "424242/cancel/").status_code == 404
    assert staff.post(SCHEDULES + "999/pause/").status_code == 404


def test_run_filter_sidebar_offers_names_from_small_tables(staff, assorted):
    body = staff.get(RUNS).content.decode()
    assert "?schedule=dies" in body and "?queue=slow" in body and "?task_name=tests.noop" in body


# --------------------------------------------------------------------------
# Workers and events


@pytest.fixture
def two_workers(clock):
    workers.register_worker(worker_id="fresh", hostname="h1", pid=1, queues=["default"], now=clock.now())
    workers.register_worker(worker_id="silent", hostname="h2", pid=2, queues=[],
                            now=clock.now() - timedelta(minutes=5))
    workers.register_worker(worker_id="done", hostname="h3", pid=3, queues=[], now=clock.now())
    workers.set_status(worker_id="done", status=WorkerStatus.STOPPED, now=clock.now())
    clock.advance(seconds=10)


def test_worker_changelist_shows_liveness_and_heartbeat_age(staff, two_workers):
    response = staff.get(WORKERS)
    assert response.status_code == 200
    body = response.content.decode()
    assert "distsched-live-alive" in body and "distsched-live-stale" in body and "distsched-live-stopped" in body
    assert "5m 10s" in body and ">10s<" in body


@pytest.mark.parametrize(("liveness", "expected"), [("alive", {"fresh"}), ("stale", {"silent"}),
                                                     ("stopped", {"done"})])
def test_worker_liveness_filter(staff, two_workers, liveness, expected):
    response = staff.get(WORKERS, {"liveness": liveness})
    assert {w.pk for w in response.context["cl"].result_list} == expected


def test_worker_change_page_is_read_only(staff, two_workers):
    worker = Worker.objects.get(pk="silent")
    response = staff.get(change_url(worker))
    assert response.status_code == 200
    body = response.content.decode()
    assert "distsched-live-stale" in body and 'name="_save"' not in body
    assert staff.get(reverse("admin:distsched_app_worker_add")).status_code == 403


def test_worker_current_run_links_to_the_run(staff, scheduler, make_schedule, clock):
    run = running_run(scheduler, make_schedule, clock)
    workers.register_worker(worker_id="w-run", hostname="h", pid=1, queues=[], now=clock.now())
    workers.heartbeat(worker_id="w-run", now=clock.now(), current_run_id=run.pk)
    assert change_url(run) in staff.get(WORKERS).content.decode()


def test_event_pages_are_read_only(staff, scheduler, make_schedule):
    run = dead_run(scheduler, make_schedule)
    response = staff.get(EVENTS)
    assert response.status_code == 200
    event = RunEvent.objects.filter(run=run).first()
    response = staff.get(change_url(event))
    assert response.status_code == 200 and 'name="_save"' not in response.content.decode()
    assert staff.get(reverse("admin:distsched_app_runevent_add")).status_code == 403
    assert staff.post(change_url(event), {"message": "rewritten"}).status_code == 403
    assert staff.get(reverse("admin:distsched_app_runevent_delete", args=[event.pk])).status_code == 403


def test_event_filter_and_search(staff, scheduler, make_schedule):
    dead = dead_run(scheduler, make_schedule)
    other = pending_run(scheduler, make_schedule, "other")
    response = staff.get(EVENTS, {"event_type__exact": "marked_dead"})
    assert [e.run_id for e in response.context["cl"].result_list] == [dead.pk]
    response = staff.get(EVENTS, {"q": str(other.pk)})
    assert {e.run_id for e in response.context["cl"].result_list} == {other.pk}
    response = staff.get(EVENTS, {"q": "kaboom"})
    assert {e.event_type for e in response.context["cl"].result_list} == {"failed"}


def test_admin_pages_need_a_staff_login(client):
    for url in (SCHEDULES, RUNS, WORKERS, EVENTS, reverse("admin:distsched_dashboard")):
        response = client.get(url)
        assert response.status_code == 302 and "/login/" in response["Location"]
