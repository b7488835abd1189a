"""The snippets of the declared-schedules, per-task-options and Celery pages do what the pages say."""

from __future__ import annotations

import re
import sys
import types
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from distsched_app.models import Run, Schedule
from distsched_app.registry import registry
from distsched_app.services import enqueue, task_options
from distsched_app.services.declared_schedules import apply_declared, problems

DOCS = Path(__file__).resolve().parents[2] / "docs"


def blocks(page: str, language: str, containing: str) -> list[str]:
    text = (DOCS / page).read_text()
    return [b for b in re.findall(rf"```{language}\n(.*?)```", text, re.S) if containing in b]


@pytest.fixture
def fake_tasks():
    """The task names the pages use, registered for the test only."""
    names = ["send_summary", "reports.tasks.build", "partners.tasks.poll"]
    for name in names:
        registry.register(name, lambda *a, **k: None)
    yield
    for name in names:
        registry.unregister(name)


@pytest.fixture
def billing_errors(monkeypatch):
    """The reader's own exception module the pages name."""
    module = types.ModuleType("billing.errors")
    module.CardDeclined = type("CardDeclined", (Exception,), {})
    monkeypatch.setitem(sys.modules, "billing", types.ModuleType("billing"))
    monkeypatch.setitem(sys.modules, "billing.errors", module)
    task_options._imported.cache_clear()
    yield
    task_options._imported.cache_clear()


@pytest.mark.django_db
def test_the_declared_schedules_snippet_is_valid_and_applies(fake_tasks, clock):
    [snippet] = blocks("howto/periodic-tasks.md", "python", '"SCHEDULES"')
    namespace: dict = {}
    exec(snippet, namespace)  # noqa: S102 - the docs' own text, as a user pastes it
    declared = namespace["DISTSCHED"]["SCHEDULES"]
    assert problems(declared, now=clock.now()) == []
    assert apply_declared(clock, declared).count("created") == 2
    nightly = Schedule.objects.get(name="nightly-report")
    assert (nightly.cron, nightly.timezone, nightly.catch_up, nightly.overlap) == (
        "0 3 * * *",
        "Europe/Paris",
        "skip",
        "skip",
    )
    assert Schedule.objects.get(name="poll-partner").max_attempts == 5


@pytest.mark.django_db
def test_the_per_task_options_snippet_is_valid_and_followed(billing_errors, settings, clock):
    [snippet] = blocks("reference/settings.md", "python", '"TASK_OPTIONS"')
    namespace: dict = {"__name__": "docs_snippet"}
    exec(snippet, namespace)  # noqa: S102
    try:
        settings.DISTSCHED = namespace["DISTSCHED"]
        assert task_options.options_problem("billing.charge", registry.get("billing.charge").options) is None
        assert task_options.problems() == []
        run = enqueue.enqueue(enqueue.Job(task_name="billing.charge", args=[1]), now=clock.now()).run
        assert (run.queue, run.max_attempts, run.retry_policy["base"]) == ("io", 5, 30)
        declined = sys.modules["billing.errors"].CardDeclined
        assert task_options.give_up_reason("billing.charge", declined) == "CardDeclined is in the task's give_up_on"
        assert task_options.give_up_reason("billing.charge", ValueError) == "ValueError is not in the task's retry_on"
    finally:
        registry.unregister("billing.charge")


def test_the_celery_guides_task_options_are_valid(billing_errors):
    [snippet] = blocks("howto/migrate-celery.md", "python", '"TASK_OPTIONS"')
    namespace: dict = {}
    exec(snippet, namespace)  # noqa: S102
    for name, options in namespace["DISTSCHED"]["TASK_OPTIONS"].items():
        assert task_options.options_problem(name, options) is None


@pytest.mark.django_db
def test_the_celery_guides_beat_schedule_imports_as_shown(fake_tasks, settings, clock):
    [snippet] = blocks("howto/migrate-celery.md", "python", "CELERY_BEAT_SCHEDULE")

    class crontab:
        def __init__(self, minute="*", hour="*", day_of_week="*", day_of_month="*", month_of_year="*"):
            self._orig_minute, self._orig_hour, self._orig_day_of_week = minute, hour, day_of_week
            self._orig_day_of_month, self._orig_month_of_year = day_of_month, month_of_year

    class solar:
        def __init__(self, event, lat, lon):
            self.event, self.lat, self.lon = event, lat, lon

    namespace: dict = {"crontab": crontab, "solar": solar}
    exec(snippet, namespace)  # noqa: S102
    settings.CELERY_TIMEZONE = namespace["CELERY_TIMEZONE"]
    settings.CELERY_BEAT_SCHEDULE = namespace["CELERY_BEAT_SCHEDULE"]
    [shell] = blocks("howto/migrate-celery.md", "bash", "import celery-beat --dry-run")
    shown = shell.split("--dry-run\n", 1)[1].split("\n$ ", 1)[0]
    out = StringIO()
    call_command("distsched", "import", "celery-beat", "--dry-run", stdout=out)
    assert out.getvalue().strip() == shown.strip()
    call_command("distsched", "import", "celery-beat", stdout=StringIO())
    assert sorted(Schedule.objects.values_list("name", flat=True)) == ["nightly-report", "poll-partner"]
    assert Schedule.objects.get(name="poll-partner").queue == "io" and not Run.objects.exists()
