"""What the admin tests share: the list URLs, the messages a page shows, running an action, runs in a state."""

from __future__ import annotations

from django.contrib.messages import get_messages
from django.urls import reverse

from distsched_app.models import Run, RunState
from distsched_app.services import claiming

SCHEDULES = reverse("admin:distsched_app_schedule_changelist")
RUNS = reverse("admin:distsched_app_run_changelist")
WORKERS = reverse("admin:distsched_app_worker_changelist")
EVENTS = reverse("admin:distsched_app_runevent_changelist")


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
