"""The limits admin: every declared limit with its status, a limit's page with the override form,
reset and history, permissions, bad input; and the run page's "Why is it waiting?" block."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission
from django.urls import reverse

from distsched_app.models import Limit, LimitEvent, Run, RunState
from distsched_app.services import claiming, limit_overrides, queues
from distsched_app.services.enqueue import Job, enqueue
from tests.adapters.admin.pages import change_url, messages_of
from tests.conftest import T0

pytestmark = pytest.mark.django_db

LIMITS = reverse("admin:distsched_app_limit_changelist")
DECLARED = {
    "acct": {"task": "tests.echo", "concurrency": 1, "partition_by": ["account"]},
    "my_api": {"queue": "api", "rate": "5/s", "burst": 2},  # "_": the admin quotes names in URLs
}


def limit_url(name: str) -> str:
    return reverse("admin:distsched_app_limit_change", args=[quote(name)])


def reset_url(name: str) -> str:
    return reverse("admin:distsched_app_limit_reset", args=[quote(name)])


@pytest.fixture
def declared(settings):
    settings.DISTSCHED = {**settings.DISTSCHED, "LIMITS": DECLARED}


def user_client(client, django_user_model, username: str, codenames: list[str]):
    user = django_user_model.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="distsched_app", codename__in=codenames)
    )
    client.force_login(user)
    return client


@pytest.fixture
def operator_client(client, django_user_model, clock):
    """Staff holding change_limit only (which lets them read limits too)."""
    return user_client(client, django_user_model, "ann", ["change_limit"])


@pytest.fixture
def viewer_client(client, django_user_model, clock):
    return user_client(client, django_user_model, "vic", ["view_limit"])


def blocked_pair(clock, account: int = 1) -> tuple[Run, Run]:
    """Two runs of one partition of ``acct``: the first running, the second blocked behind it."""
    a = enqueue(Job(task_name="tests.echo", kwargs={"account": account}), now=clock.now()).run
    b = enqueue(Job(task_name="tests.echo", kwargs={"account": account}), now=clock.now()).run
    for worker in ("w1", "w2"):
        claiming.claim_runs(worker_id=worker, queues=None, lease_seconds=30, now=clock.now(), limit=1)
    assert Run.objects.get(pk=b.pk).state == RunState.BLOCKED
    return a, b


# -- the list ------------------------------------------------------------------------------------------


def test_the_list_shows_every_declared_limit_with_its_status(operator_client, declared, clock):
    blocked_pair(clock)
    limit_overrides.set_override("my_api", {"rate": "50/s"}, now=clock.now(), by="user:alice", for_seconds=3600)
    assert not Limit.objects.filter(name="acct").exists()  # listed although no row holds it
    response = operator_client.get(LIMITS)
    assert response.status_code == 200
    body = response.content.decode()
    assert [r["status"].name for r in response.context["rows"]] == ["acct", "my_api"]
    acct, api = response.context["rows"]
    assert (acct["status"].in_use, acct["status"].blocked, acct["partitions"]) == (1, 1, "'1': 1 blocked, 1 in use")
    assert (acct["declared"], acct["effective"], acct["override"]) == ("concurrency 1", "concurrency 1", "-")
    assert api["declared"] == "rate 5/s, burst 2" and api["effective"] == "rate 50/s, burst 2"
    assert api["override"] == "rate 50/s (by user:alice until 2026-03-02 10:00:00 UTC)"
    assert limit_url("my_api") in body and limit_url("acct") in body
    assert "task tests.echo" in body and "queue api" in body


def test_the_list_says_when_no_limit_is_declared_or_the_setting_is_invalid(operator_client, settings):
    assert 'id="distsched-no-limits"' in operator_client.get(LIMITS).content.decode()
    settings.DISTSCHED = {**settings.DISTSCHED, "LIMITS": {"x": {"task": "t"}}}
    response = operator_client.get(LIMITS)
    assert response.status_code == 200 and "limits nothing" in response.content.decode()


def test_the_admin_index_links_to_the_limits(operator_client, declared):
    assert LIMITS in operator_client.get(reverse("admin:index")).content.decode()


# -- a limit's page: override, reset, history -----------------------------------------------------------------


def test_the_form_sets_an_override_through_the_service_as_the_request_user(operator_client, declared, clock):
    _, b = blocked_pair(clock)
    form = {"concurrency": "2", "reason": "backlog", "duration": "30m"}
    response = operator_client.post(limit_url("acct"), form, follow=True)
    assert response.redirect_chain[-1][0] == limit_url("acct")
    assert (
        "success",
        "Limit acct overridden: concurrency 2 until 2026-03-02T09:30:00Z; 1 blocked run(s) let through.",
    ) in messages_of(response)
    row = Limit.objects.get(name="acct")
    assert (row.override, row.override_by, row.override_reason) == ({"concurrency": 2}, "user:ann", "backlog")
    assert row.override_until == T0 + timedelta(minutes=30)
    event = LimitEvent.objects.get()
    assert (event.action, event.actor, event.reason, event.override) == (
        "set",
        "user:ann",
        "backlog",
        {"concurrency": 2},
    )
    assert Run.objects.get(pk=b.pk).state == RunState.PENDING  # let through in the same transaction
    body = response.content.decode()
    assert "<td>set</td><td>user:ann</td><td>concurrency 2</td><td>2026-03-02 09:30:00</td><td>backlog</td>" in body
    assert 'id="distsched-reset"' in body
    assert response.context["form"].initial == {"concurrency": 2, "reason": "backlog"}  # the override, to edit


def test_pausing_a_limit_and_a_name_the_admin_quotes(operator_client, declared, clock):
    response = operator_client.post(limit_url("my_api"), {"paused": "on", "reason": "partner outage"}, follow=True)
    assert ("success", "Limit my_api overridden: paused until reset.") in messages_of(response)
    assert Limit.objects.get(name="my_api").override == {"paused": True}


@pytest.mark.parametrize(
    ("form", "field", "text"),
    [
        ({"rate": "fast"}, "rate", "rate must look like"),
        ({"concurrency": "-3"}, "concurrency", "whole number"),
        ({"concurrency": "many"}, "concurrency", "Enter a whole number"),
        ({"concurrency": "1", "duration": "soon"}, "duration", "is not a duration"),
        ({"concurrency": "1", "duration": "0"}, "duration", "for must be 1-"),
        ({}, None, "give at least one of concurrency"),
        ({"concurrency": "1", "reason": "x" * 1001}, "reason", "at most 1000"),
    ],
)
def test_bad_input_shows_the_error_on_the_form_and_writes_nothing(operator_client, declared, form, field, text):
    response = operator_client.post(limit_url("acct"), form)
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert text in " ".join(errors.get(field or "__all__", [])), errors
    assert "Please correct the error" in response.content.decode()
    assert not LimitEvent.objects.exists() and not Limit.objects.filter(override__isnull=False).exists()


def test_the_reset_button_resets_and_is_post_only(operator_client, declared, clock):
    limit_overrides.set_override("my_api", {"rate": "1/s"}, now=clock.now(), by="cli:bob", reason="slow down")
    assert operator_client.get(reset_url("my_api")).status_code == 405
    response = operator_client.post(reset_url("my_api"), follow=True)
    assert response.redirect_chain[-1][0] == limit_url("my_api")
    assert ("success", "Limit my_api reset to its declared numbers.") in messages_of(response)
    assert list(LimitEvent.objects.values_list("action", "actor")) == [("reset", "user:ann"), ("set", "cli:bob")]
    assert Limit.objects.get(name="my_api").override is None
    body = response.content.decode()
    assert 'id="distsched-reset"' not in body and body.count("<tr><td>2026-03-02 09:00:00</td>") == 2
    response = operator_client.post(reset_url("my_api"), follow=True)
    assert ("warning", "Limit my_api has no override: nothing changed.") in messages_of(response)
    assert LimitEvent.objects.count() == 2


def test_an_unknown_limit_goes_back_to_the_list_with_a_warning(operator_client, declared):
    response = operator_client.get(limit_url("ghost"), follow=True)
    assert response.redirect_chain[-1][0] == LIMITS
    assert ("warning", "no limit named 'ghost' is declared in DISTSCHED['LIMITS']") in messages_of(response)
    response = operator_client.post(limit_url("ghost"), {"concurrency": "1"}, follow=True)
    assert response.redirect_chain[-1][0] == LIMITS and not LimitEvent.objects.exists()
    assert operator_client.post(reset_url("ghost"), follow=True).redirect_chain[-1][0] == LIMITS


def test_limits_are_neither_added_nor_deleted_by_hand(operator_client, declared, clock):
    limit_overrides.set_override("acct", {"concurrency": 3}, now=clock.now(), by="user:ann")
    assert operator_client.get(reverse("admin:distsched_app_limit_add")).status_code == 403
    assert operator_client.get(reverse("admin:distsched_app_limit_delete", args=["acct"])).status_code == 403


# -- permissions --------------------------------------------------------------------------------------------------


def test_a_viewer_sees_limits_but_cannot_override_or_reset(viewer_client, declared, clock):
    limit_overrides.set_override("acct", {"concurrency": 3}, now=clock.now(), by="user:ann")
    assert viewer_client.get(LIMITS).status_code == 200
    body = viewer_client.get(limit_url("acct")).content.decode()
    assert "concurrency 3 (by user:ann until reset)" in body
    assert 'id="distsched-override-form"' not in body and 'id="distsched-reset"' not in body
    assert viewer_client.post(limit_url("acct"), {"concurrency": "9"}).status_code == 403
    assert viewer_client.post(reset_url("acct")).status_code == 403
    assert Limit.objects.get(name="acct").override == {"concurrency": 3}
    assert LimitEvent.objects.count() == 1


def test_staff_without_limit_permissions_see_nothing(client, django_user_model, declared, clock):
    other = user_client(client, django_user_model, "ned", ["view_queuepause"])
    assert other.get(LIMITS).status_code == 403
    assert other.get(limit_url("acct")).status_code == 403
    assert other.post(limit_url("acct"), {"concurrency": "9"}).status_code == 403
    assert other.post(reset_url("acct")).status_code == 403
    assert not LimitEvent.objects.exists()


# -- the run page: "Why is it waiting?" -----------------------------------------------------------------------------


def test_the_run_page_says_why_a_blocked_run_waits_with_links(staff, declared, clock):
    a, b = blocked_pair(clock)
    queues.pause_queue("default", now=clock.now(), by="user:alice", reason="vendor outage")
    response = staff.get(change_url(b))
    assert response.status_code == 200
    body = response.content.decode()
    assert "Why is it waiting?" in body
    reasons = response.context["why_waiting"]["reasons"]
    assert [r["kind"] for r in reasons] == ["queue_paused", "concurrency"]
    assert reasons[1]["message"].startswith("limit acct (partition '1') is full")
    assert f"limit acct (partition &#x27;1&#x27;) is full: 1/1 running (run(s) {a.pk})" in body
    assert f'<a href="{change_url(a)}">run {a.pk}</a>' in body  # the holder, linked
    assert f'<a href="{limit_url("acct")}">limit acct</a>' in body
    assert reverse("admin:distsched_app_queuepause_change", args=["default"]) in body


def test_the_run_page_of_a_replacement_links_the_run_it_waits_for(staff, clock, make_schedule, scheduler):
    make_schedule("r", interval_seconds=60, overlap="replace")
    [first] = scheduler.tick()
    claiming.claim_next_run(worker_id="A", queues=None, lease_seconds=300, now=clock.now())
    clock.advance(seconds=60)
    [second] = scheduler.tick()
    body = staff.get(change_url(second)).content.decode()
    assert f"waiting for run {first.pk} it replaces (overlap=replace)" in body
    assert f'<a href="{change_url(first)}">run {first.pk}</a>' in body


def test_the_run_page_of_a_later_run_gives_its_earliest_start_and_a_finished_run_no_block(
    staff, clock, scheduler, make_schedule
):
    later = enqueue(Job(task_name="tests.noop", run_after=T0 + timedelta(hours=1)), now=clock.now()).run
    body = staff.get(change_url(later)).content.decode()
    assert "not due yet: scheduled for 2026-03-02T10:00:00Z" in body
    assert "Earliest possible start: 2026-03-02T10:00:00Z." in body
    make_schedule("s1")
    [run] = scheduler.tick()
    scheduler.cancel_run(run.pk)
    response = staff.get(change_url(run))
    assert response.context["why_waiting"] is None and "Why is it waiting?" not in response.content.decode()
