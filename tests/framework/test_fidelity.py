"""Fidelity to Django's task framework: what a framework user sees matches its contract."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from distsched_app import framework
from distsched_app.models import Run, RunState
from distsched_app.registry import registry
from tests.testapp import tasks as t

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
ELSEWHERE = "tests.testapp.elsewhere"


@pytest.fixture
def worker(scheduler):
    return scheduler.worker(worker_id="w", heartbeat_seconds=3600)


def test_a_prefetched_run_reads_running_with_started_at_while_it_executes(scheduler, clock):
    results = [t.ft_own_status.enqueue() for _ in range(3)]
    worker = scheduler.worker(worker_id="w", heartbeat_seconds=3600, prefetch=10)
    worker.pace.observe(0.001)  # quick tasks: one claim takes all three, the last two prefetched (leased)
    assert worker.run(burst=True, install_signals=False) == 3
    for result in results:
        result.refresh()
        assert result.return_value == {"status": "RUNNING", "started": True}
        assert result.started_at is not None


def test_get_result_and_refresh_keep_run_after(worker, clock):
    later = clock.now() + timedelta(hours=1)
    deferred = t.ft_add.using(run_after=later).enqueue(1, 2)
    fetched = t.ft_add.get_result(deferred.id)
    assert fetched.task.run_after == later
    assert fetched.task == deferred.task
    deferred.refresh()
    assert deferred.task.run_after == later
    now = t.ft_add.enqueue(3, 4)
    assert t.ft_add.get_result(now.id).task == now.task and now.task.run_after is None


def forget_elsewhere() -> None:
    """As in a process that never imported the module."""
    registry.unregister(f"{ELSEWHERE}.ft_elsewhere")
    sys.modules.pop(ELSEWHERE, None)


def test_a_task_outside_tasks_py_runs_and_its_result_is_read_in_another_process(worker):
    from tests.testapp.elsewhere import ft_elsewhere

    result = ft_elsewhere.enqueue(41)
    forget_elsewhere()
    assert worker.run_once().state == RunState.SUCCEEDED  # the worker imported the module
    assert ELSEWHERE in sys.modules
    forget_elsewhere()
    fetched = framework.default_task_backend.get_result(result.id)
    assert (fetched.status.name, fetched.return_value) == ("SUCCESSFUL", 42)


@pytest.mark.parametrize("name", [f"{ELSEWHERE}.plain", f"{ELSEWHERE}.NOT_A_TASK", "json.dumps", "os.system"])
def test_a_name_that_is_not_a_framework_task_of_an_installed_app_is_never_run(worker, clock, name):
    forget_elsewhere()
    result = t.ft_add.enqueue(1, 2)
    Run.objects.filter(pk=int(result.id)).update(task_name=name)
    assert worker.run_once().state == RunState.PENDING  # unknown: given back, unattempted
    assert name not in registry
    # Only a module of an installed app is imported to look (and then nothing there runs).
    assert (ELSEWHERE in sys.modules) == name.startswith(ELSEWHERE)
    with pytest.raises(framework.TaskResultDoesNotExist):
        framework.default_task_backend.get_result(result.id)


def test_a_return_value_that_is_not_json_fails_the_task_as_in_django(worker):
    result = t.ft_returns.enqueue("set")
    assert worker.run_once().state == RunState.DEAD  # MAX_ATTEMPTS=1
    result.refresh()
    assert result.status.name == "FAILED"
    assert result.errors[0].exception_class_path == "builtins.TypeError"
    tuple_result = t.ft_returns.enqueue("tuple")
    assert worker.run_once().state == RunState.SUCCEEDED
    tuple_result.refresh()
    assert tuple_result.return_value == [1, 2]


def test_task_finished_is_sent_inside_the_exception_handler(worker, caplog):
    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append(sys.exc_info()[1])

    framework.task_finished.connect(receiver)
    try:
        with caplog.at_level(logging.ERROR):
            t.ft_fail.enqueue("kaput")
            worker.run_once()
    finally:
        framework.task_finished.disconnect(receiver)
    assert [type(e) for e in seen] == [ValueError] and str(seen[0]) == "kaput"
    # The framework's own receiver logs the failure with the task's traceback.
    [record] = [r for r in caplog.records if r.name in ("django_tasks", "django.tasks") and "FAILED" in r.getMessage()]
    assert record.exc_info is not None and record.exc_info[0] is ValueError


def test_runs_record_the_backend_alias_that_enqueued_them(make_schedule, scheduler):
    default = t.ft_add.enqueue(1, 2)
    other = t.ft_add.using(backend="retrying").enqueue(1, 2)
    make_schedule("s", task_name="tests.noop")
    scheduler.tick()
    aliases = dict(Run.objects.values_list("pk", "backend"))
    assert aliases[int(default.id)] == "default"
    assert aliases[int(other.id)] == "retrying"
    assert Run.objects.get(schedule__name="s").backend is None


def test_a_project_without_distsched_app_gets_a_clear_check_error(tmp_path):
    (tmp_path / "no_app_settings.py").write_text(
        "from tests.settings import *  # noqa\n"
        "INSTALLED_APPS = [a for a in INSTALLED_APPS if a not in ('distsched_app', 'examples.demo', 'tests.testapp')]\n"
        "ROOT_URLCONF = 'no_app_urls'\n"
    )
    (tmp_path / "no_app_urls.py").write_text("urlpatterns = []\n")
    script = (
        "import django; django.setup()\n"
        "from django.core.management import call_command\n"
        "from tests.testapp.elsewhere import ft_elsewhere  # a @task imports\n"
        "try:\n"
        "    ft_elsewhere.enqueue(1)\n"
        "except Exception as exc:\n"
        "    print('enqueue:', type(exc).__name__, exc)\n"
        "call_command('check')\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "no_app_settings", "PYTHONPATH": f"{tmp_path}:{ROOT}"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    message = "'distsched_app' is not in INSTALLED_APPS"
    assert done.returncode != 0
    assert f"enqueue: ImproperlyConfigured TASKS names distsched_app.backends.DistschedBackend, but {message}" in (
        done.stdout
    )
    assert "distsched.E012" in done.stderr and message in done.stderr
    assert "RuntimeError" not in done.stderr
