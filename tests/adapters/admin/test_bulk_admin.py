"""The admin's bulk actions: "select all N" on the run list makes a job from the filter; its pages."""

from __future__ import annotations

import pytest
from django.urls import reverse

from distsched_app.admin.bulk import changelist_filter
from distsched_app.models import AuditEntry, BulkAction, BulkState, Run, RunState
from distsched_app.services import bulk
from tests.adapters.admin.pages import RUNS, messages_of
from tests.bulk_factories import make_runs

pytestmark = pytest.mark.django_db

BULK = reverse("admin:distsched_app_bulkaction_changelist")


def select_all(client, query: str, action: str, some_pk: int):
    """The changelist's form as "Select all N runs" posts it: to the filtered URL, select_across=1."""
    data = {"action": action, "select_across": "1", "index": "0", "_selected_action": [some_pk]}
    response = client.post(f"{RUNS}?{query}", data, follow=True)
    assert response.status_code == 200, response.content[:500]
    return messages_of(response)


def states(ids) -> set[str]:
    return set(Run.objects.filter(pk__in=ids).values_list("state", flat=True))


def test_select_all_creates_a_job_from_the_filter_and_acts_on_nothing_in_the_request(staff, clock):
    dead = make_runs(60, now=clock.now(), queue="reports")
    other = make_runs(5, now=clock.now(), queue="emails", prefix="other")
    [(level, text)] = select_all(staff, "state=dead&queue=reports", "requeue_runs", dead[0])
    job = BulkAction.objects.get()
    assert (
        level == "success" and f"Bulk action {job.pk}" in text and "60 run(s) matching state=dead queue=reports" in text
    )
    assert (job.action, job.filter, job.matched, job.state) == (
        "requeue",
        {"state": "dead", "queue": "reports"},
        60,
        "pending",
    )
    assert (job.actor, job.source) == ("user:admin", "admin")
    assert states(dead) == {RunState.DEAD}  # the request acted on nothing
    assert AuditEntry.objects.get().data["matched"] == 60
    bulk.process_bulk_actions(clock)
    assert states(dead) == {RunState.PENDING} and states(other) == {RunState.DEAD}


def test_a_page_selection_still_acts_at_once(staff, clock):
    ids = make_runs(3, now=clock.now())
    response = staff.post(f"{RUNS}?state=dead", {"action": "requeue_runs", "_selected_action": ids[:2]}, follow=True)
    assert messages_of(response) == [("success", "Requeued 2 run(s): pending now.")]
    assert not BulkAction.objects.exists()
    assert states(ids[:2]) == {RunState.PENDING} and states(ids[2:]) == {RunState.DEAD}


@pytest.mark.parametrize(
    ("query", "why"),
    [
        ("q=kaboom", "a search cannot be applied"),
        ("priority=high", "a priority band cannot be applied"),
        ("state=succeeded", "requeue applies to dead, cancelled runs only"),
    ],
)
def test_a_filter_bulk_cannot_state_refuses_instead_of_acting_on_something_else(staff, clock, query, why):
    [run] = make_runs(1, now=clock.now())
    [(level, text)] = select_all(staff, query, "requeue_runs", run)
    assert level == "warning" and text.startswith("Nothing done") and why in text
    assert not BulkAction.objects.exists()


def test_a_list_parameter_bulk_does_not_know_is_refused(rf):
    found, why = changelist_filter(rf.get(RUNS, {"state": "dead", "schedule__id__gte": "3", "o": "-1"}))
    assert found is None and why == "the filter 'schedule__id__gte' cannot be applied to all matching runs"
    found, why = changelist_filter(rf.get(RUNS, {"state": "dead", "priority": "-5", "q": " ", "p": "2"}))
    assert found == {"state": "dead", "priority": -5} and why == ""


def test_cancel_select_all_and_the_job_pages(staff, clock):
    ids = make_runs(4, now=clock.now(), state=RunState.PENDING, queue="q")
    select_all(staff, "queue=q", "cancel_runs", ids[0])
    job = BulkAction.objects.get()
    listing = staff.get(BULK).content.decode()
    assert "queue=q" in listing and "0 of 4 (0%)" in listing
    bulk.process_bulk_actions(clock)
    page = staff.get(reverse("admin:distsched_app_bulkaction_change", args=[job.pk])).content.decode()
    assert "4 of 4 (100%)" in page and "distsched-state-done" in page and 'name="_save"' not in page
    assert states(ids) == {RunState.CANCELLED} and BulkAction.objects.get().state == BulkState.DONE


def test_bulk_pages_need_a_run_permission(client, django_user_model, clock):
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user(username="viewer", password="pw", is_staff=True)
    client.force_login(user)
    assert client.get(BULK).status_code == 403
    user.user_permissions.add(Permission.objects.get(codename="view_run"))
    assert client.get(BULK).status_code == 200


def test_the_stop_button_stops_an_unfinished_job(staff, clock):
    make_runs(3, now=clock.now())
    job = bulk.create_bulk_action(action="requeue", filter={"state": "dead"}, now=clock.now())
    page = reverse("admin:distsched_app_bulkaction_change", args=[job.pk])
    assert 'id="distsched-stop"' in staff.get(page).content.decode()
    stop = reverse("admin:distsched_app_bulkaction_stop", args=[job.pk])
    assert staff.get(stop).status_code == 405  # POST only
    response = staff.post(stop, follow=True)
    assert messages_of(response) == [("success", f"Stopped bulk action {job.pk}; the 0 run(s) it requeued stay so.")]
    job.refresh_from_db()
    assert job.state == BulkState.CANCELLED and AuditEntry.objects.filter(action="stop").count() == 1
    assert 'id="distsched-stop"' not in staff.get(page).content.decode()  # ended: no button
    assert [level for level, _ in messages_of(staff.post(stop, follow=True))] == ["warning"]
