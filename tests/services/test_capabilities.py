"""Worker capabilities: a run of a task in TASK_REQUIRES goes only to a worker with all of its
capabilities (the ORM claim here; tests/db/test_claims.py compares it with PostgreSQL's one
statement), lease recovery, next_due, the worker option and the system check."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework.test import APIClient

from distsched_app.checks import check_distsched_settings
from distsched_app.errors import ValidationError
from distsched_app.models import EventType, Run, RunEvent, RunState, Worker
from distsched_app.services import capabilities, claiming
from distsched_app.services.capabilities import InvalidCapability
from distsched_app.services.enqueue import Job, enqueue
from tests.conftest import T0

pytestmark = pytest.mark.django_db

GPU = {"tests.echo": ["gpu"], "tests.fail": ["gpu", "cuda"]}


@pytest.fixture
def gpu(settings):
    settings.DISTSCHED = {**settings.DISTSCHED, "TASK_REQUIRES": GPU}


def due(task_name: str, *, priority: int = 0, max_attempts: int | None = None, seconds: float = 0) -> Run:
    run = enqueue(Job(task_name=task_name, priority=priority), now=T0 + timedelta(seconds=seconds)).run
    if max_attempts is not None:
        Run.objects.filter(pk=run.pk).update(max_attempts=max_attempts)
    return run


def claim(clock, worker: str, *caps: str, lease: float = 30, limit: int = 1) -> list[Run]:
    return claiming.claim_runs(
        worker_id=worker, queues=None, lease_seconds=lease, now=clock.now(), limit=limit, capabilities=caps
    )


def test_excluded_tasks_are_the_tasks_whose_capabilities_the_worker_lacks(gpu):
    assert capabilities.excluded_tasks([]) == ["tests.echo", "tests.fail"]
    assert capabilities.excluded_tasks(["gpu"]) == ["tests.fail"]
    assert capabilities.excluded_tasks(["cuda", "gpu", "more"]) == []
    assert capabilities.missing_capabilities("tests.fail", ["gpu"]) == ["cuda"]
    assert capabilities.missing_capabilities("tests.noop", []) == []


def test_no_requirements_configured_means_no_exclusion(settings):
    assert capabilities.excluded_tasks([]) == []


def test_a_run_goes_only_to_a_worker_with_every_capability_its_task_requires(gpu, clock):
    echo = due("tests.echo", priority=10)  # first in line
    fail = due("tests.fail", priority=5)
    noop = due("tests.noop")
    assert [r.pk for r in claim(clock, "plain", limit=10)] == [noop.pk]  # other runs go to anyone
    assert [r.pk for r in claim(clock, "half", "gpu", limit=10)] == [echo.pk]
    assert claim(clock, "half", "gpu", limit=10) == []
    assert [r.pk for r in claim(clock, "full", "cuda", "gpu")] == [fail.pk]


def test_an_expired_lease_a_worker_cannot_take_goes_back_to_pending_for_a_capable_one(gpu, clock):
    echo = due("tests.echo")
    claim(clock, "gpu-1", "gpu", lease=10)
    clock.advance(seconds=11)
    assert claim(clock, "plain") == []  # recovered, not re-claimed
    echo.refresh_from_db()
    assert (echo.state, echo.lease_owner, echo.attempts) == (RunState.PENDING, "", 1)
    note = RunEvent.objects.get(run=echo, event_type=EventType.LEASE_EXPIRED).message
    assert "this worker lacks gpu: back to pending" in note
    [again] = claim(clock, "gpu-2", "gpu")
    assert (again.pk, again.lease_owner, again.attempts) == (echo.pk, "gpu-2", 2)


def test_an_expired_lease_out_of_attempts_is_marked_dead_by_any_worker(gpu, clock):
    echo = due("tests.echo", max_attempts=1)
    claim(clock, "gpu-1", "gpu", lease=10)
    clock.advance(seconds=11)
    assert claim(clock, "plain") == []
    echo.refresh_from_db()
    assert echo.state == RunState.DEAD


def test_next_due_ignores_runs_the_worker_may_not_claim(gpu, clock):
    due("tests.echo", seconds=5)
    due("tests.noop", seconds=30)
    assert claiming.next_due(queues=None).run == T0 + timedelta(seconds=30)  # not the gpu run's 5 s
    assert claiming.next_due(queues=None, capabilities=["gpu"]).run == T0 + timedelta(seconds=5)
    Run.objects.filter(task_name="tests.noop").delete()
    assert claiming.next_due(queues=None).run is None  # an idle worker without gpu sleeps, not spins


def test_a_malformed_setting_refuses_the_claim_with_a_typed_error(settings, clock):
    settings.DISTSCHED = {"TASK_REQUIRES": {"tests.echo": "gpu"}}
    with pytest.raises(ValidationError, match="TASK_REQUIRES"):
        claim(clock, "w")


# -- the worker --------------------------------------------------------------------------


def test_the_worker_records_and_logs_its_capabilities(gpu, scheduler, caplog):
    worker = scheduler.worker(worker_id="w-gpu", capabilities=["gpu", "avx", "gpu"], heartbeat_seconds=3600)
    assert worker.capabilities == ["avx", "gpu"]
    with caplog.at_level(logging.INFO, logger="distsched"):
        worker.register()
    assert Worker.objects.get().capabilities == ["avx", "gpu"]
    [started] = [r for r in caplog.records if r.getMessage() == "worker started"]
    assert started.distsched["capabilities"] == "avx,gpu"
    assert started.distsched["not_taking"] == "tests.fail"


def test_a_worker_without_capabilities_runs_the_other_runs_and_leaves_the_gpu_run(gpu, scheduler):
    echo = due("tests.echo", priority=10)
    noop = due("tests.noop")
    plain = scheduler.worker(worker_id="plain", heartbeat_seconds=3600)
    assert plain.run(burst=True, install_signals=False) == 1
    assert Run.objects.get(pk=noop.pk).state == RunState.SUCCEEDED
    assert Run.objects.get(pk=echo.pk).state == RunState.PENDING
    capable = scheduler.worker(worker_id="capable", capabilities=["gpu"], heartbeat_seconds=3600)
    assert capable.run(burst=True, install_signals=False) == 1
    assert Run.objects.get(pk=echo.pk).state == RunState.SUCCEEDED


@pytest.mark.parametrize("bad", ["gpu", ["gpu x"], [""], ["-gpu"], [3], ["g" * 101]])
def test_the_worker_refuses_malformed_capabilities(scheduler, bad):
    with pytest.raises(InvalidCapability) as caught:
        scheduler.worker(worker_id="w", capabilities=bad)
    assert caught.value.field == "capabilities"


def test_the_worker_refuses_to_start_under_a_malformed_setting(settings, scheduler):
    settings.DISTSCHED = {"TASK_REQUIRES": ["gpu"]}
    with pytest.raises(ValidationError, match="TASK_REQUIRES"):
        scheduler.worker(worker_id="w")


def test_runworker_turns_a_bad_capability_into_a_command_error():
    with pytest.raises(CommandError, match="invalid capability 'a b'"):
        call_command("runworker", "--once", "--capability=gpu", "--capability=a b")


def test_runworker_capabilities_reach_the_worker_row(gpu):
    call_command("runworker", "--once", "--worker-id=cli-w", "--capability=gpu", "--capability=cuda")
    assert Worker.objects.get(pk="cli-w").capabilities == ["cuda", "gpu"]


def test_the_api_shows_a_workers_capabilities(gpu, scheduler, admin_user):
    scheduler.worker(worker_id="w-gpu", capabilities=["gpu"], heartbeat_seconds=3600).register()
    client = APIClient()
    client.force_authenticate(admin_user)
    [row] = client.get("/api/workers/").json()["results"]
    assert row["capabilities"] == ["gpu"]


# -- the system check ------------------------------------------------------------------------


def e004(settings, value) -> list[str]:
    settings.DISTSCHED = {"TASK_REQUIRES": value}
    return [e.msg for e in check_distsched_settings(None) if e.id == "distsched.E004"]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (["gpu"], "must be a dict"),
        ({"tests.echo": "gpu"}, "must be a non-empty list"),
        ({"tests.echo": []}, "must be a non-empty list"),
        ({"tests.echo": ["gpu", "two words"]}, "invalid capability name 'two words'"),
        ({"tests.echo": [None]}, "invalid capability name None"),
        ({"": ["gpu"]}, "not a task name"),
        ({7: ["gpu"]}, "not a task name"),
    ],
)
def test_a_malformed_task_requires_is_a_system_check_error(settings, value, message):
    [error] = e004(settings, value)
    assert message in error and "TASK_REQUIRES" in error


def test_a_well_formed_task_requires_passes_the_check(settings):
    assert e004(settings, {}) == []
    assert e004(settings, GPU) == []


# -- a run that no live worker can take says so ----------------------------------------------


def test_a_waiting_run_no_live_worker_can_take_says_so_in_the_api_admin_and_metrics(
    gpu, scheduler, clock, admin_user, admin_client
):
    from distsched_app import metrics
    from distsched_app.services.stats import read_snapshot

    echo = due("tests.echo")
    fail = due("tests.fail")
    due("tests.noop")
    api = APIClient()
    api.force_authenticate(admin_user)

    def detail(run: Run) -> list[str]:
        return api.get(f"/api/runs/{run.pk}").json()["waiting_for_capabilities"]

    def gauge() -> float:
        [family] = [
            f for f in metrics.families(read_snapshot(clock.now())) if f.name == "distsched_runs_without_capable_worker"
        ]
        return family.samples[0].value

    assert (detail(echo), detail(fail), gauge()) == (["gpu"], ["cuda", "gpu"], 2)
    assert "waiting_for_capabilities" not in api.get("/api/runs").json()["results"][0]  # detail only
    page = admin_client.get(f"/admin/distsched_app/run/{echo.pk}/change/").content.decode()
    assert (
        "waiting for capabilities" in page.lower()
        and "gpu (no live worker serving queue default has all of them)" in page
    )

    scheduler.worker(worker_id="gpu-other-queue", queues=["other"], capabilities=["gpu"]).register()
    assert (detail(echo), gauge()) == (["gpu"], 2)  # it does not serve the run's queue
    scheduler.worker(worker_id="gpu", capabilities=["gpu"]).register()
    assert (detail(echo), detail(fail), gauge()) == ([], ["cuda", "gpu"], 1)
    scheduler.worker(worker_id="cuda", capabilities=["cuda"]).register()
    assert detail(fail) == ["cuda", "gpu"]  # both offered, but by no one worker
    clock.advance(seconds=3600)  # every worker stale: none is live
    assert (detail(echo), gauge()) == (["gpu"], 2)
    [claimed] = claim(clock, "late", "gpu")
    assert detail(claimed) == []  # only waiting runs say so


def test_without_task_requires_the_gauge_is_zero_and_costs_no_query(django_assert_num_queries, clock):
    due("tests.echo")
    with django_assert_num_queries(0):
        assert capabilities.runs_without_capable_worker(clock.now()) == 0
