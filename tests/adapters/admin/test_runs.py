"""The runs admin: list, filters and search, the read-only page with its history, cancel and requeue."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from distsched_app.admin import support as admin_support
from distsched_app.admin.display import pretty_json
from distsched_app.models import EventType, Run, RunEvent, RunState
from distsched_app.services import claiming
from distsched_app.services import enqueue as enqueue_service
from tests.adapters.admin.pages import (
    EVENTS,
    RUNS,
    act,
    change_url,
    dead_run,
    messages_of,
    pending_run,
    running_run,
)

pytestmark = pytest.mark.django_db


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
    assert RunEvent.objects.get(run=pending, event_type=EventType.CANCELLED).message == "cancelled by user:admin"


def test_cancel_action_on_a_finished_run_is_a_warning_not_an_error(staff, scheduler, make_schedule):
    dead = dead_run(scheduler, make_schedule)
    pending = pending_run(scheduler, make_schedule, "p")
    msgs = act(staff, RUNS, "cancel_runs", [dead, pending])
    assert msgs[0] == (
        "warning",
        f"1 run(s) not cancelled: run {dead.pk} is dead; only pending, retrying, blocked, "
        "leased or running runs can be cancelled",
    )
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
        ("warning", f"1 run(s) not requeued: run {pending.pk} is pending; only dead or cancelled runs can be requeued"),
    ]
    assert Run.objects.get(pk=pending.pk).state == RunState.PENDING


def cancelled_holding_a_taken_key(scheduler, clock, key: str = "nightly") -> tuple[Run, Run]:
    """A cancelled run with a unique key, and the unfinished run enqueued with that key since."""
    cancelled = enqueue(clock, "tests.noop", unique_key=key)
    scheduler.cancel_run(cancelled.pk)
    return cancelled, enqueue(clock, "tests.noop", unique_key=key)


def test_requeue_action_reports_a_taken_unique_key_and_requeues_the_others(staff, scheduler, make_schedule, clock):
    dead = dead_run(scheduler, make_schedule)
    taken, holder = cancelled_holding_a_taken_key(scheduler, clock)
    assert act(staff, RUNS, "requeue_runs", [dead, taken]) == [
        (
            "warning",
            f"1 run(s) not requeued: run {taken.pk} cannot be requeued: unfinished run {holder.pk} "
            "of task tests.noop holds its unique key 'nightly'",
        ),
        ("success", "Requeued 1 run(s): pending now."),
    ]
    assert Run.objects.get(pk=dead.pk).state == RunState.PENDING
    assert Run.objects.get(pk=taken.pk).state == RunState.CANCELLED


def test_requeue_button_reports_a_taken_unique_key(staff, scheduler, clock):
    taken, holder = cancelled_holding_a_taken_key(scheduler, clock)
    response = staff.post(change_url(taken).removesuffix("change/") + "requeue/", follow=True)
    assert response.status_code == 200 and response.redirect_chain[-1][0] == change_url(taken)
    assert messages_of(response) == [
        (
            "warning",
            f"1 run(s) not requeued: run {taken.pk} cannot be requeued: unfinished run {holder.pk} "
            "of task tests.noop holds its unique key 'nightly'",
        )
    ]
    assert Run.objects.get(pk=taken.pk).state == RunState.CANCELLED


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


def test_a_blocked_run_page_names_the_run_it_replaces_and_can_cancel_it(staff, scheduler, make_schedule, clock):
    make_schedule("r", interval_seconds=60, overlap="replace")
    [old] = scheduler.tick()
    claiming.claim_next_run(worker_id="w-run", queues=None, lease_seconds=300, now=clock.now())
    clock.advance(seconds=60)
    [blocked] = scheduler.tick()
    body = staff.get(change_url(blocked)).content.decode()
    assert "Blocked behind" in body and f"<a href='{change_url(old)}'>run {old.pk}</a>" in body
    assert 'id="distsched-cancel"' in body
    assert "replaced by run" in staff.get(change_url(old)).content.decode()
    staff.post(change_url(blocked).removesuffix("change/") + "cancel/", follow=True)
    assert Run.objects.get(pk=blocked.pk).state == RunState.CANCELLED


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


def enqueue(clock, task_name: str, **options) -> Run:
    return enqueue_service.enqueue(enqueue_service.Job(task_name=task_name, **options), now=clock.now()).run


@pytest.fixture
def assorted(scheduler, make_schedule, clock):
    dead = dead_run(scheduler, make_schedule, "dies")
    other = pending_run(scheduler, make_schedule, "other", task_name="tests.echo", queue="slow")
    manual = scheduler.trigger("other")
    # Enqueued runs have no schedule: every filter and the search must take them in their stride.
    enq = enqueue(clock, "tests.testapp.tasks.ft_add", args=[1, 2], queue="slow", priority=5, unique_key="nightly-1")
    low = enqueue(clock, "tests.echo", priority=-3)
    return {"dead": dead, "other": other, "manual": manual, "enq": enq, "low": low}


def ids_listed(response) -> set[int]:
    return {obj.pk for obj in response.context["cl"].result_list}


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, {"dead", "other", "manual", "enq", "low"}),
        ({"state": "dead"}, {"dead"}),
        ({"state": "pending"}, {"other", "manual", "enq", "low"}),
        ({"task_name": "tests.fail"}, {"dead"}),
        ({"task_name": "tests.testapp.tasks.ft_add"}, {"enq"}),
        ({"queue": "slow"}, {"other", "manual", "enq"}),
        ({"schedule": "other"}, {"other", "manual"}),
        ({"schedule": "other", "origin": "manual"}, {"manual"}),
        ({"schedule": "other", "origin": "enqueued"}, set()),
        ({"origin": "enqueued"}, {"enq", "low"}),
        ({"origin": "schedule"}, {"dead", "other"}),
        ({"priority": "high"}, {"enq"}),
        ({"priority": "normal"}, {"dead", "other", "manual"}),
        ({"priority": "low"}, {"low"}),
        ({"priority": "5"}, {"enq"}),
        ({"priority": "-3"}, {"low"}),
        ({"priority": "0", "origin": "manual"}, {"manual"}),
        ({"priority": "7"}, set()),
        ({"priority": "101"}, set()),
        ({"priority": "abc"}, set()),
        ({"priority": "--3"}, set()),
        ({"q": "disk full"}, {"dead"}),
        ({"q": "other:"}, {"other"}),
        ({"q": "manual:"}, {"manual"}),
        ({"q": "enqueued:"}, {"enq", "low"}),
        ({"q": "nightly-1"}, {"enq"}),  # a unique key, whole
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


def test_run_filter_sidebar_offers_names_from_small_tables(staff, assorted):
    body = staff.get(RUNS).content.decode()
    assert "?schedule=dies" in body and "?queue=slow" in body and "?task_name=tests.noop" in body
    # Framework tasks under their module path, the queues they declare; origins and priority bands.
    assert "?task_name=tests.testapp.tasks.ft_add" in body and "?queue=urgent" in body
    assert "?origin=enqueued" in body
    assert all(f"?priority={band}" in body for band in ("high", "normal", "low"))


def test_enqueued_runs_in_the_list_show_priority_and_no_schedule(staff, assorted):
    response = staff.get(RUNS, {"origin": "enqueued"})
    body = response.content.decode()
    assert "<span class='distsched-muted'>enqueued</span>" in body
    assert 'class="column-priority' in body
    rows = {r.pk: r for r in response.context["cl"].result_list}
    assert rows[assorted["enq"].pk].priority == 5 and rows[assorted["enq"].pk].schedule is None
    assert "/admin/distsched_app/schedule/" not in body.split('id="result_list"')[1].split("</table>")[0]


def readonly(body: str, field: str) -> str:
    """The shown value of a read-only field of a change page."""
    match = re.search(rf'field-{field}".*?<div class="readonly">(.*?)</div>', body, re.DOTALL)
    assert match, field
    return match.group(1).strip()


def test_enqueued_run_page_shows_priority_unique_key_retry_policy_and_result(staff, scheduler, clock):
    run = enqueue(clock, "tests.echo", args=[4], priority=7, unique_key="report-2026-03")
    body = staff.get(change_url(run)).content.decode()
    assert readonly(body, "schedule_link") == "<span class='distsched-muted'>enqueued</span>"
    assert (readonly(body, "priority"), readonly(body, "unique_key_text")) == ("7", "report-2026-03")
    # Its own policy, written when it was enqueued (services.enqueue.default_policy: the settings).
    assert readonly(body, "retry_policy_text") == "3 attempt(s); retry after 10s, doubling up to 3600s; jitter 0"
    assert readonly(body, "result_json") == "-"
    assert scheduler.worker(worker_id="w1", heartbeat_seconds=3600).run_once().state == RunState.SUCCEEDED
    body = staff.get(change_url(run)).content.decode()
    assert readonly(body, "result_json") == pretty_json({"args": [4], "kwargs": {}})


def test_scheduled_run_page_names_the_schedule_as_the_source_of_its_retry_policy(staff, scheduler, make_schedule):
    run = pending_run(scheduler, make_schedule, "p", max_attempts=4, retry_base_seconds=5)
    body = staff.get(change_url(run)).content.decode()
    assert readonly(body, "retry_policy_text") == (
        "4 attempt(s); retry after 5s, doubling up to 3600s; jitter 0 (the schedule&#x27;s)"
    )
    assert (readonly(body, "priority"), readonly(body, "unique_key_text")) == ("0", "-")


def test_a_retry_policy_written_by_hand_does_not_break_the_run_page(staff, clock):
    run = enqueue(clock, "tests.noop")
    Run.objects.filter(pk=run.pk).update(retry_policy={"attempts": "many"})
    response = staff.get(change_url(run))
    assert response.status_code == 200
    assert (
        readonly(response.content.decode(), "retry_policy_text")
        == "unreadable: {&#x27;attempts&#x27;: &#x27;many&#x27;}"
    )
