"""The workers and run-events admin: read-only pages, worker liveness, event filters and search."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse

from distsched_app.models import RunEvent, Worker, WorkerStatus
from distsched_app.services import workers
from tests.adapters.admin.pages import (
    EVENTS,
    WORKERS,
    change_url,
    dead_run,
    pending_run,
    running_run,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_workers(clock):
    workers.register_worker(worker_id="fresh", hostname="h1", pid=1, queues=["default"], now=clock.now())
    workers.register_worker(worker_id="silent", hostname="h2", pid=2, queues=[], now=clock.now() - timedelta(minutes=5))
    workers.register_worker(worker_id="done", hostname="h3", pid=3, queues=[], now=clock.now())
    workers.set_status(worker_id="done", status=WorkerStatus.STOPPED, now=clock.now())
    clock.advance(seconds=10)


def test_worker_changelist_shows_liveness_and_heartbeat_age(staff, two_workers):
    response = staff.get(WORKERS)
    assert response.status_code == 200
    body = response.content.decode()
    assert "distsched-live-alive" in body and "distsched-live-stale" in body and "distsched-live-stopped" in body
    assert "5m 10s" in body and ">10s<" in body


@pytest.mark.parametrize(("liveness", "expected"), [("alive", {"fresh"}), ("stale", {"silent"}), ("stopped", {"done"})])
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
