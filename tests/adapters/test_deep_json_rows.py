"""One stored row whose JSON is nested far too deeply never blocks the rest.

Such a row cannot be written through distsched (``MAX_PAYLOAD_DEPTH`` is at most
100), but one written by hand, by a bug or under an older limit used to make
``GET /api/runs`` a 500 for everyone and every claim on its queue fail with
``RecursionError``. Now it decodes as ``{"undecodable": ...}`` everywhere: the
lists render, the queue runs, the bad run ends dead with the reason and can be
deleted.
"""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.urls import reverse

from distsched_app.management.commands.distsched import Command
from distsched_app.models import EventType, Run, RunEvent, RunState
from distsched_app.text import MAX_DECODED_DEPTH, UndecodableJSON
from tests.testapp import tasks as test_tasks

pytestmark = pytest.mark.django_db

DEPTHS = [MAX_DECODED_DEPTH + 1, 990]


def nested(levels: int) -> str:
    return "[" * levels + "]" * levels


def write_args(run: Run, text: str) -> None:
    """Store ``text`` as the run's args, past every check (as a hand-written UPDATE would)."""
    cast = "::jsonb" if connection.vendor == "postgresql" else ""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE distsched_app_run SET args = %s{cast} WHERE id = %s", [text, run.pk])


@pytest.fixture(params=DEPTHS, ids=lambda d: f"depth-{d}")
def deep_run(request, scheduler, make_schedule) -> Run:
    make_schedule("deep", task_name="tests.echo")
    [run] = scheduler.tick()
    write_args(run, nested(request.param))
    return run


def test_a_deep_value_decodes_as_undecodable_and_a_shallow_one_as_itself(deep_run):
    assert isinstance(Run.objects.get(pk=deep_run.pk).args, UndecodableJSON)
    write_args(deep_run, nested(MAX_DECODED_DEPTH))
    assert Run.objects.get(pk=deep_run.pk).args == json.loads(nested(MAX_DECODED_DEPTH))


def test_the_queue_runs_on_and_the_bad_run_ends_dead_with_its_reason(deep_run, scheduler, make_schedule):
    make_schedule("fine", task_name="tests.echo", args=[1])
    scheduler.tick()
    worker = scheduler.worker(worker_id="w1", heartbeat_seconds=3600)
    assert worker.run_once().state == RunState.DEAD  # its run comes first: claimed, not called
    assert worker.run_once().state == RunState.SUCCEEDED
    bad, good = Run.objects.get(pk=deep_run.pk), Run.objects.get(schedule__name="fine")
    assert good.state == RunState.SUCCEEDED
    assert test_tasks.CALLS == [{"args": [1], "kwargs": {}}]  # the bad run's task was never called
    assert bad.state == RunState.DEAD and bad.attempts == 1 < bad.max_attempts  # no retry can help
    assert "args cannot be decoded: stored JSON nested deeper than" in bad.last_error
    kinds = list(RunEvent.objects.filter(run=bad).order_by("id").values_list("event_type", flat=True))
    assert kinds[-2:] == [EventType.FAILED, EventType.MARKED_DEAD]


def test_the_bad_run_can_be_deleted_through_the_orm(deep_run):
    Run.objects.get(pk=deep_run.pk).delete()
    assert not Run.objects.filter(pk=deep_run.pk).exists()


def test_the_api_lists_and_shows_it(deep_run, api_clock, make_api_user, token_client):
    api = token_client(make_api_user("root", superuser=True))
    listed = api.get("/api/runs")
    assert listed.status_code == 200
    assert listed.json()["results"][0]["args"] == {"undecodable": Run.objects.get(pk=deep_run.pk).args.reason}
    assert api.get(f"/api/runs/{deep_run.pk}").status_code == 200


def test_the_admin_renders_it(deep_run, admin_client):
    assert admin_client.get(reverse("admin:distsched_app_run_changelist")).status_code == 200
    page = admin_client.get(reverse("admin:distsched_app_run_change", args=[deep_run.pk]))
    assert page.status_code == 200 and "undecodable" in page.content.decode()


@pytest.mark.parametrize("as_json", [False, True])
def test_the_cli_shows_it(deep_run, clock, as_json):
    out = StringIO()
    extra = ["--json"] if as_json else []
    call_command(Command(), "run", "show", str(deep_run.pk), *extra, stdout=out, stderr=StringIO())
    call_command(Command(), "run", "list", *extra, stdout=out, stderr=StringIO())
    assert "undecodable" in out.getvalue()


def test_max_payload_depth_is_capped_well_below_what_decoding_handles(settings):
    from django.core.checks import run_checks

    settings.DISTSCHED = {"MAX_PAYLOAD_DEPTH": 1000}
    errors = [e for e in run_checks() if "MAX_PAYLOAD_DEPTH" in e.msg]
    assert errors and "100" in errors[0].msg
    settings.DISTSCHED = {"MAX_PAYLOAD_DEPTH": 100}
    assert not [e for e in run_checks() if "MAX_PAYLOAD_DEPTH" in e.msg]


def test_a_framework_result_of_such_a_run_is_failed_and_shows_no_arguments(scheduler, clock):
    from distsched_app.framework import TaskResultStatus

    result = test_tasks.ft_add.enqueue(1, 2)
    write_args(Run.objects.get(pk=int(result.id)), nested(990))
    assert scheduler.worker(worker_id="w1", heartbeat_seconds=3600).run_once().state == RunState.DEAD
    final = test_tasks.ft_add.get_result(result.id)
    assert final.status == TaskResultStatus.FAILED and final.args == [] and final.kwargs == {}
