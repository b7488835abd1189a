"""docs/howto/migrate-celery.md, followed in real processes: a small Celery project's code shapes
(``@shared_task`` functions, ``.delay`` calls, ``CELERY_TASK_ROUTES``, ``autoretry_for``, a
``CELERY_BEAT_SCHEDULE`` with a crontab, an interval and a solar entry) moved as the guide says:
its settings blocks pasted as written, the tasks rewritten by its table, ``distsched import
celery-beat`` (dry run, then for real), a tick and one worker per queue.

Celery is not installed: ``celery/schedules.py`` in the throwaway project is a stand-in with only
what the importer reads (a crontab's ``_orig_*`` fields, a solar's ``event`` and ``lat``), so the
guide's beat block is pasted with the import a Celery project has.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "howto" / "migrate-celery.md"

pytestmark = pytest.mark.skipif(
    __import__("importlib.util").util.find_spec("requests") is None,
    reason="the guide's TASK_OPTIONS retry on requests' exceptions (Sphinx installs requests)",
)

CELERY_SCHEDULES = '''
"""A stand-in for celery.schedules: only the attributes distsched's importer reads."""


class crontab:
    def __init__(self, minute="*", hour="*", day_of_week="*", day_of_month="*", month_of_year="*"):
        self._orig_minute, self._orig_hour, self._orig_day_of_week = minute, hour, day_of_week
        self._orig_day_of_month, self._orig_month_of_year = day_of_month, month_of_year


class solar:
    def __init__(self, event, lat, lon):
        self.event, self.lat, self.lon = event, lat, lon
'''
IMPORT_TASK = """
try:
    from django.tasks import task
except ImportError:
    from django_tasks import task
from pathlib import Path

LOG = Path(__file__).resolve().parents[1] / "ran.txt"


def record(line):
    with LOG.open("a") as out:
        out.write(line + "\\n")
"""
# The guide's table, row by row: @shared_task -> @task, CELERY_TASK_ROUTES -> @task(queue_name=...),
# bind=True / self.request.retries -> takes_context=True / context.attempt - 1, .delay -> .enqueue.
APPS = {
    "reports/tasks.py": IMPORT_TASK
    + """

@task  # was @shared_task
def build(report_id):
    record(f"build {report_id}")
    return report_id
""",
    "reports/views.py": """
from django.db import transaction

from .tasks import build


def order_report(report_id):
    with transaction.atomic():
        return build.enqueue(report_id)  # was transaction.on_commit(lambda: build.delay(report_id))
""",
    "partners/tasks.py": IMPORT_TASK
    + """
import requests


@task(queue_name="io", takes_context=True)  # was @shared_task(bind=True), routed to "io" by CELERY_TASK_ROUTES
def poll(context, partner="acme"):
    retries = context.attempt - 1  # was self.request.retries
    record(f"poll {partner} retries={retries}")
    if partner == "flaky" and retries == 0:
        raise requests.exceptions.ConnectionError("partner down")  # in retry_on: retried
    if partner == "broken":
        raise ValueError("bad answer")  # not in retry_on: dead at once
    return partner
""",
    "billing/errors.py": """
class CardDeclined(Exception):
    pass
""",
    "billing/tasks.py": IMPORT_TASK
    + """
from .errors import CardDeclined


@task  # was @shared_task(throws=(CardDeclined,))
def charge(account_id):
    record(f"charge {account_id}")
    raise CardDeclined(account_id)
""",
}

RUNS = """
import json
from distsched_app.models import Run
print(json.dumps([
    {"task": r.task_name, "queue": r.queue, "state": r.state, "attempts": r.attempts, "args": r.args,
     "origin": r.origin, "schedule": r.schedule.name if r.schedule else None, "result": r.result}
    for r in Run.objects.order_by("task_name", "id")
]))
"""


def guide_blocks() -> tuple[list[str], list[str]]:
    """The guide's Python and bash blocks, in order."""
    blocks = re.findall(r"^```(\w+)\n(.*?)^```$", GUIDE.read_text(), re.MULTILINE | re.DOTALL)
    return [b for lang, b in blocks if lang == "python"], [b for lang, b in blocks if lang == "bash"]


def expected_dry_run() -> str:
    """The output the guide shows for ``import celery-beat --dry-run``."""
    [session] = [b for b in guide_blocks()[1] if "import celery-beat --dry-run" in b]
    return session.split("--dry-run\n", 1)[1].split("\n$ ", 1)[0].strip()


def settings_from_guide() -> str:
    """The project's settings with the guide's three settings blocks pasted as written; the
    retry waits nothing, so one burst sees the retry (a test's speed, not the guide's advice)."""
    tasks_block, options_block, beat_block = guide_blocks()[0]
    return (
        "from scheduler_project.settings import *  # noqa\n"
        "from celery.schedules import crontab, solar\n"
        "ROOT_URLCONF = 'empty_urls'\n"
        "INSTALLED_APPS = [a for a in INSTALLED_APPS if a != 'examples.demo'] + ['reports', 'partners', 'billing']\n"
        + tasks_block
        + options_block
        + beat_block
        + "DISTSCHED['TASK_OPTIONS']['partners.tasks.poll']['retry_base_seconds'] = 0\n"
    )


@pytest.fixture
def project(tmp_path: Path):
    (tmp_path / "celery").mkdir()
    (tmp_path / "celery" / "__init__.py").write_text("")
    (tmp_path / "celery" / "schedules.py").write_text(CELERY_SCHEDULES)
    for path, body in APPS.items():
        (tmp_path / path).parent.mkdir(exist_ok=True)
        (tmp_path / path).parent.joinpath("__init__.py").touch()
        (tmp_path / path).write_text(body)
    (tmp_path / "empty_urls.py").write_text("urlpatterns = []\n")
    (tmp_path / "settings.py").write_text(settings_from_guide())

    def manage(*argv: str) -> str:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": f"{tmp_path}:{ROOT}",
            "DJANGO_SETTINGS_MODULE": "settings",
            "DATABASE_URL": os.environ.get("MIGRATION_TEST_DATABASE_URL", f"sqlite:///{tmp_path / 'db.sqlite3'}"),
        }
        done = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *argv],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"{argv}: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        return done.stdout

    manage.log = tmp_path / "ran.txt"  # type: ignore[attr-defined]
    return manage


def test_the_guide_names_the_steps_this_test_follows():
    text = GUIDE.read_text()
    for row in (
        "| `@shared_task` | `@task`",
        "| `add.delay(2, 2)`, `add.apply_async((2, 2))` | `add.enqueue(2, 2)` |",
        "| `bind=True`, `self.request.retries` | `@task(takes_context=True)`, `context.attempt - 1` |",
        '| `throws=` / `dont_autoretry_for=` | `DISTSCHED["TASK_OPTIONS"][name]["give_up_on"]` |',
        '`CELERY_TASK_ROUTES` becomes a queue per task: in the decorator\n(`@task(queue_name="io")`)',
        "(`runworker --queues io`)",
        "Then replace `celery beat` by a ticker (`runworker --with-tick` or `tick --loop`).",
    ):
        assert row in text
    python, _ = guide_blocks()
    assert [b.split("\n", 1)[0] for b in python] == ["TASKS = {", "DISTSCHED = {", 'CELERY_TIMEZONE = "Europe/Paris"']
    assert expected_dry_run().startswith("SCHEDULE        DONE              WHAT\nnightly-report")


def runs(project) -> list[dict]:
    return json.loads(project("shell", "-c", RUNS).strip().splitlines()[-1])


@pytest.mark.slow  # real processes: manage.py commands, a ticker and two workers
@pytest.mark.sqlite_project
def test_migrating_a_celery_project_as_the_guide_says(project):
    project("migrate", "--noinput")
    project("flush", "--noinput")  # a clean slate when MIGRATION_TEST_DATABASE_URL names a used database
    # 3. The beat schedule: a dry run says what would be created and writes nothing ...
    assert project("distsched", "import", "celery-beat", "--dry-run").strip() == expected_dry_run()
    assert project("distsched", "schedule", "list", "--json").strip() == "[]"
    # ... then for real; importing again changes nothing.
    assert "CELERY_BEAT_SCHEDULE: 2 created, 1 not translated" in project("distsched", "import", "celery-beat")
    again = project("distsched", "import", "celery-beat")
    assert "CELERY_BEAT_SCHEDULE: 2 exists, 1 not translated" in again and "the same: nothing to do" in again
    schedules = {s["name"]: s for s in json.loads(project("distsched", "schedule", "list", "--json"))}
    assert set(schedules) == {"nightly-report", "poll-partner"}
    nightly, poll = schedules["nightly-report"], schedules["poll-partner"]
    assert (nightly["task_name"], nightly["cron"], nightly["timezone"], nightly["args"]) == (
        "reports.tasks.build",
        "0 3 * * *",
        "Europe/Paris",
        [42],
    )
    assert nightly["next_run_at"].endswith(("T02:00:00Z", "T01:00:00Z", "T02:00:00+00:00", "T01:00:00+00:00"))
    assert (poll["task_name"], poll["interval_seconds"], poll["queue"]) == ("partners.tasks.poll", 300, "io")
    # The --print-settings snippet is settings that declare the same two schedules.
    snippet = project("distsched", "import", "celery-beat", "--print-settings")
    declared: dict = {"DISTSCHED": {}}
    exec(snippet, declared)  # noqa: S102 - our own command's output, checked to be valid settings
    assert declared["DISTSCHED"]["SCHEDULES"]["poll-partner"] == {
        "task": "partners.tasks.poll",
        "interval_seconds": 300,
        "queue": "io",
    }

    # 2. Tasks and calls: .enqueue() where .delay() was; the ticker makes the interval's first run.
    project("shell", "-c", textwrap.dedent("""
        from reports.views import order_report
        from partners.tasks import poll
        from billing.tasks import charge
        order_report(7); poll.enqueue("flaky"); poll.enqueue("broken"); charge.enqueue(0)
    """))  # fmt: skip
    project("distsched", "schedule", "trigger", "nightly-report")  # its 03:00 slot is hours away
    project("tick")
    # A worker of the default queue runs the default queue's tasks only ...
    project("runworker", "--queues", "default", "--burst")
    by_task: dict[str, list[dict]] = {}
    for run in runs(project):
        by_task.setdefault(run["task"], []).append(run)
    assert sorted((r["args"], r["state"], r["origin"]) for r in by_task["reports.tasks.build"]) == [
        ([7], "succeeded", "enqueued"),
        ([42], "succeeded", "manual"),
    ]
    # give_up_on (Celery's throws=): the backend's MAX_ATTEMPTS 5 would retry; dead at the first failure.
    [charged] = by_task["billing.tasks.charge"]
    assert (charged["state"], charged["attempts"]) == ("dead", 1)
    assert {(r["queue"], r["state"]) for r in by_task["partners.tasks.poll"]} == {("io", "pending")}
    assert len(by_task["partners.tasks.poll"]) == 3  # flaky, broken, and the schedule's
    # ... and a worker of the io queue runs the routed task.
    project("runworker", "--queues", "io", "--burst")
    polled = {(tuple(r["args"]), r["schedule"]): r for r in runs(project) if r["task"] == "partners.tasks.poll"}
    scheduled, flaky, broken = polled[((), "poll-partner")], polled[(("flaky",), None)], polled[(("broken",), None)]
    assert (scheduled["state"], scheduled["result"], scheduled["queue"]) == ("succeeded", "acme", "io")
    # retry_on: the ConnectionError is retried (and the retry succeeds); a ValueError is not.
    assert (flaky["state"], flaky["attempts"], flaky["result"]) == ("succeeded", 2, "flaky")
    assert (broken["state"], broken["attempts"]) == ("dead", 1)
    lines = project.log.read_text().splitlines()
    assert sorted(lines) == sorted([
        "build 7", "build 42", "charge 0",
        "poll acme retries=0", "poll flaky retries=0", "poll flaky retries=1", "poll broken retries=0",
    ])  # fmt: skip
