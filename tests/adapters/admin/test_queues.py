"""The paused-queues admin: the list (who, when, why), the pause form, resume (action and button),
the history, permissions, and the run page saying when its queue is paused."""

from __future__ import annotations

import pytest
from django.contrib.admin.utils import quote
from django.urls import reverse

from distsched_app.models import QueueEvent, QueuePause
from distsched_app.services import queues
from distsched_app.services.enqueue import Job, enqueue
from tests.adapters.admin.pages import act, change_url, messages_of

pytestmark = pytest.mark.django_db

PAUSES = reverse("admin:distsched_app_queuepause_changelist")
ADD = reverse("admin:distsched_app_queuepause_add")
QUEUE_EVENTS = reverse("admin:distsched_app_queueevent_changelist")


def pause_url(queue: str) -> str:
    return reverse("admin:distsched_app_queuepause_change", args=[quote(queue)])


def resume_url(queue: str) -> str:
    return reverse("admin:distsched_app_queuepause_resume", args=[quote(queue)])


@pytest.fixture
def operator_client(client, django_user_model, clock):
    """Staff holding the queue permissions only (view and change of paused queues)."""
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user("ann", password="pw", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="distsched_app", codename__in=["change_queuepause", "view_queueevent"]
        )
    )
    client.force_login(user)
    return client


def test_the_add_form_pauses_through_the_service_as_the_request_user(operator_client):
    response = operator_client.post(ADD, {"queue": "reports", "reason": "vendor outage"}, follow=True)
    assert response.status_code == 200
    assert ("success", "Paused queue reports: its runs are not claimed until it is resumed.") in messages_of(response)
    pause = QueuePause.objects.get()
    assert (pause.queue, pause.paused_by, pause.reason) == ("reports", "user:ann", "vendor outage")
    assert list(QueueEvent.objects.values_list("action", "actor", "reason")) == [("pause", "user:ann", "vendor outage")]


@pytest.mark.parametrize("name", ["bad name", "x" * 101])
def test_the_add_form_refuses_a_bad_name_with_the_services_message(operator_client, name):
    response = operator_client.post(ADD, {"queue": name, "reason": ""})
    assert response.status_code == 200
    assert "queue may contain only letters" in response.content.decode() or "at most 100" in response.content.decode()
    assert not QueuePause.objects.exists()


def test_the_add_form_says_who_already_paused_it(operator_client, clock):
    queues.pause_queue("reports", now=clock.now(), by="cli:bob", reason="first")
    response = operator_client.post(ADD, {"queue": "reports", "reason": "second"})
    assert "queue reports is already paused, by cli:bob at 2026-03-02 09:00:00" in response.content.decode()
    assert QueuePause.objects.get().reason == "first"


def test_the_list_shows_who_when_and_why(operator_client, clock):
    queues.pause_queue("reports", now=clock.now(), by="user:alice", reason="vendor outage")
    body = operator_client.get(PAUSES).content.decode()
    assert "reports" in body and "user:alice" in body and "vendor outage" in body and "2026-03-02 09:00:00" in body


def test_the_resume_action_resumes_and_wakes_through_the_service(operator_client, clock):
    for queue in ("a", "b"):
        queues.pause_queue(queue, now=clock.now(), by="code:tests")
    found = act(operator_client, PAUSES, "resume_queues", QueuePause.objects.all())
    assert ("success", "Resumed 2 queue(s): a, b.") in found
    assert not QueuePause.objects.exists()
    assert list(QueueEvent.objects.filter(action="resume").values_list("actor", flat=True)) == ["user:ann"] * 2


def test_the_pause_page_is_read_only_with_a_resume_button_and_the_history(operator_client, clock):
    queues.pause_queue("my_queue", now=clock.now(), by="user:alice", reason="one")  # "_": the admin quotes pks
    queues.resume_queue("my_queue", now=clock.now(), by="user:alice")
    queues.pause_queue("my_queue", now=clock.now(), by="cli:bob", reason="two")
    response = operator_client.get(pause_url("my_queue"))
    assert response.status_code == 200
    body = response.content.decode()
    assert 'id="distsched-resume"' in body and resume_url("my_queue") in body
    assert 'name="_save"' not in body
    assert body.count("<tr><td>2026-03-02 09:00:00</td>") == 3  # pause, resume, pause
    assert operator_client.get(resume_url("my_queue")).status_code == 405  # POST only
    response = operator_client.post(resume_url("my_queue"), follow=True)
    assert response.redirect_chain[-1][0] == PAUSES
    assert ("success", "Resumed 1 queue(s): my_queue.") in messages_of(response)
    assert not QueuePause.objects.exists()


def test_pauses_are_not_deleted_by_hand(staff, clock):
    queues.pause_queue("reports", now=clock.now(), by="code:tests")
    assert staff.get(reverse("admin:distsched_app_queuepause_delete", args=["reports"])).status_code == 403
    assert "delete_selected" not in staff.get(PAUSES).content.decode()


def test_a_viewer_sees_pauses_but_cannot_pause_or_resume(client, django_user_model, clock):
    from django.contrib.auth.models import Permission

    viewer = django_user_model.objects.create_user("vic", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_queuepause"))
    client.force_login(viewer)
    queues.pause_queue("reports", now=clock.now(), by="code:tests")
    assert client.get(PAUSES).status_code == 200
    assert 'id="distsched-resume"' not in client.get(pause_url("reports")).content.decode()
    assert client.get(ADD).status_code == 403
    assert client.post(resume_url("reports")).status_code == 403
    assert QueuePause.objects.exists()


def test_the_history_list_outlives_the_pause(operator_client, clock):
    queues.pause_queue("reports", now=clock.now(), by="user:alice", reason="vendor outage")
    queues.resume_queue("reports", now=clock.now(), by="cli:bob")
    body = operator_client.get(QUEUE_EVENTS).content.decode()
    assert "vendor outage" in body and "user:alice" in body and "cli:bob" in body
    event = QueueEvent.objects.first()
    assert 'name="_save"' not in operator_client.get(change_url(event)).content.decode()


def test_the_run_page_says_when_its_queue_is_paused(staff, clock):
    run = enqueue(Job(task_name="tests.noop", queue="reports"), now=clock.now()).run
    assert "Queue paused:" in staff.get(change_url(run)).content.decode()
    queues.pause_queue("reports", now=clock.now(), by="user:alice", reason="vendor outage")
    body = staff.get(change_url(run)).content.decode()
    assert "by user:alice at 2026-03-02 09:00:00 UTC: “vendor outage”" in body
    assert pause_url("reports") in body
