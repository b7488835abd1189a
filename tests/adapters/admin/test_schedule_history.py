"""The schedule's History page in the admin: its versions from the audit trail, "restore this
version", saving with the version the form was read at, and the read-only audit log."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from distsched_app.models import AuditEntry, Schedule
from tests.adapters.admin.pages import change_url, messages_of

pytestmark = pytest.mark.django_db


def history_url(schedule: Schedule) -> str:
    return reverse("admin:distsched_app_schedule_history", args=[schedule.pk])


def restore_url(schedule: Schedule) -> str:
    return reverse("admin:distsched_app_schedule_restore", args=[schedule.pk])


def form_data(schedule: Schedule, **changes) -> dict:
    data = {
        "task_name": schedule.task_name, "args": "[]", "kwargs": "{}", "kind": schedule.kind,
        "interval_seconds": schedule.interval_seconds or "", "cron": schedule.cron, "timezone": schedule.timezone,
        "run_at": "", "start_at": "", "queue": schedule.queue, "max_attempts": schedule.max_attempts,
        "retry_base_seconds": schedule.retry_base_seconds, "retry_max_seconds": schedule.retry_max_seconds,
        "retry_jitter": schedule.retry_jitter, "catch_up": schedule.catch_up, "overlap": schedule.overlap,
        "expected_version": schedule.version, "reason": "",
    }  # fmt: skip
    return {**data, **changes}


def test_the_history_page_lists_the_versions_newest_first(staff, scheduler, make_schedule):
    s = make_schedule("s1", interval_seconds=60)
    scheduler.update_schedule("s1", interval_seconds=900, actor="user:ann", reason="slower please")
    scheduler.pause("s1", reason="vendor outage")
    response = staff.get(history_url(s))
    assert response.status_code == 200
    body = response.content.decode()
    assert body.count('class="distsched-version"') == 3
    assert body.index("vendor outage") < body.index("slower please")  # newest first
    assert "interval_seconds: 60 -&gt; 900" in body and "user:ann" in body
    assert body.count("restore this version") == 2  # not the version in force
    assert "Version 3 is in force" in body


def test_restore_this_version(staff, scheduler, make_schedule):
    s = make_schedule("s1", interval_seconds=60)
    scheduler.update_schedule("s1", interval_seconds=900)
    response = staff.post(restore_url(s), {"version": "1", "expected_version": "2"}, follow=True)
    assert response.redirect_chain[-1][0] == history_url(s)
    assert ("success", "Restored version 1 of s1: it is now version 3.") in messages_of(response)
    restored = Schedule.objects.get()
    assert (restored.version, restored.interval_seconds) == (3, 60)
    entry = AuditEntry.objects.latest("id")
    assert (entry.action, entry.actor, entry.source, entry.data) == ("restore", "user:admin", "admin", {"restored": 1})


def test_a_stale_or_unknown_restore_is_refused_with_a_message(staff, scheduler, make_schedule):
    s = make_schedule("s1")
    scheduler.update_schedule("s1", max_attempts=5)
    stale = staff.post(restore_url(s), {"version": "1", "expected_version": "1"}, follow=True)
    assert any("version 2, not 1" in text for _, text in messages_of(stale))
    unknown = staff.post(restore_url(s), {"version": "77"}, follow=True)
    assert any("has no version 77" in text for _, text in messages_of(unknown))
    missing = staff.post(restore_url(s), {"version": "x"}, follow=True)
    assert ("error", "Not restored: no version given.") in messages_of(missing)
    assert Schedule.objects.get().version == 2
    assert staff.get(restore_url(s)).status_code == 405


def test_restore_needs_the_change_permission(django_user_model, make_schedule):
    s = make_schedule("s1")
    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_schedule"))
    client = Client()
    client.force_login(viewer)
    page = client.get(history_url(s))
    assert page.status_code == 200 and "restore this version" not in page.content.decode()
    assert client.post(restore_url(s), {"version": "1"}).status_code == 403


def test_saving_the_form_records_the_reason_and_refuses_a_stale_version(staff, scheduler, make_schedule):
    s = make_schedule("s1", interval_seconds=60)
    response = staff.post(change_url(s), form_data(s, max_attempts=6, reason="flaky upstream"))
    assert response.status_code == 302, response.content[:2000]
    entry = AuditEntry.objects.latest("id")
    assert (entry.action, entry.actor, entry.source, entry.reason, entry.changes) == (
        "update", "user:admin", "admin", "flaky upstream", {"max_attempts": [3, 6]},
    )  # fmt: skip
    scheduler.update_schedule("s1", queue="other")  # someone else, meanwhile: version 3
    stale = staff.post(change_url(s), form_data(s, max_attempts=8, expected_version=2), follow=True)
    assert any("version 3, not 2" in text for _, text in messages_of(stale))
    assert Schedule.objects.values_list("max_attempts", "queue").get() == (6, "other")


def test_the_audit_log_is_read_only(staff, scheduler, make_schedule):
    make_schedule("s1")
    [run] = scheduler.tick()
    scheduler.cancel_run(run.pk, reason="wrong input")
    changelist = reverse("admin:distsched_app_auditentry_changelist")
    response = staff.get(changelist)
    assert response.status_code == 200 and "wrong input" in response.content.decode()
    entry = AuditEntry.objects.latest("id")
    page = staff.get(reverse("admin:distsched_app_auditentry_change", args=[entry.pk]))
    assert page.status_code == 200 and "Save" not in page.content.decode()
    assert staff.get(reverse("admin:distsched_app_auditentry_add")).status_code == 403
    assert staff.get(changelist + "?q=" + str(run.pk)).status_code == 200
