"""docs/howto/migrate-django-q2.md, followed in real processes: a project on django-q2 (ORM broker)
with tasks queued, the functions decorated with the framework's @task and distsched as backend, new
calls run by distsched while the old qcluster drains its queue, ``distsched migrate-status --from
django-q2`` saying when it is empty."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "howto" / "migrate-django-q2.md"
BOOT = 180  # seconds: a qcluster starts several processes on a loaded machine

pytestmark = pytest.mark.skipif(
    __import__("importlib.util").util.find_spec("django_q") is None,
    reason="django-q2 is not installed (requirements.txt installs it)",
)

OLD_TASKS = """
def add(a, b):
    return a + b
"""
# The guide's "Tasks and calls": the same function, decorated; callers use .enqueue().
NEW_TASKS = """
try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task
def add(a, b):
    return a + b
"""
BASE = (
    "from scheduler_project.settings import *  # noqa\n"
    "ROOT_URLCONF = 'empty_urls'\n"
    "SECRET_KEY = 'migration-test-only-secret-key-0123456789abcdefghijklmnopqrstuvwxyz'\n"
    "Q_CLUSTER = {'name': 'shop', 'orm': 'default', 'workers': 1, 'timeout': 30, 'retry': 60, 'poll': 0.2}\n"
)
OLD_SETTINGS = BASE + (
    "INSTALLED_APPS = [a for a in INSTALLED_APPS if a not in ('distsched_app', 'examples.demo', 'rest_framework', "
    "'rest_framework.authtoken', 'django_filters', 'drf_spectacular', 'drf_spectacular_sidecar')] "
    "+ ['django_q', 'shop']\n"
    "TASKS = {'default': {'BACKEND': 'django_tasks.backends.dummy.DummyBackend' if 'django_tasks' in "
    "INSTALLED_APPS else 'django.tasks.backends.dummy.DummyBackend'}}\n"
)
NEW_SETTINGS = BASE + (
    "INSTALLED_APPS = [*INSTALLED_APPS, 'django_q', 'shop']\n"
    "TASKS = {'default': {'BACKEND': 'distsched_app.backends.DistschedBackend', 'QUEUES': []}}\n"
)


@pytest.fixture
def project(tmp_path: Path):
    for release, tasks, settings in (("old", OLD_TASKS, OLD_SETTINGS), ("new", NEW_TASKS, NEW_SETTINGS)):
        (tmp_path / release / "shop").mkdir(parents=True)
        (tmp_path / release / "shop" / "__init__.py").write_text("")
        (tmp_path / release / "shop" / "tasks.py").write_text(tasks)
        (tmp_path / release / "settings.py").write_text(settings)
        (tmp_path / release / "empty_urls.py").write_text("urlpatterns = []\n")

    def env(release: str) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": f"{tmp_path / release}:{ROOT}",
            "DJANGO_SETTINGS_MODULE": "settings",
            "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        }

    def manage(release: str, *argv: str, stdin: str | None = None) -> str:
        done = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *argv],
            cwd=tmp_path,
            env=env(release),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=BOOT,
        )
        assert done.returncode == 0, f"{argv}: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        return done.stdout

    def spawn(release: str, *argv: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), *argv],
            cwd=tmp_path,
            env=env(release),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    manage.spawn = spawn  # type: ignore[attr-defined]
    return manage


def status(project) -> dict:
    return json.loads(project("new", "distsched", "migrate-status", "--from", "django-q2", "--json"))


def test_the_guide_names_the_steps_this_test_follows():
    text = GUIDE.read_text()
    assert "python manage.py distsched migrate-status --from django-q2" in text
    assert '| `async_task("app.tasks.send", 42)` | `send.enqueue(42)` (with `@task` on `send`) |' in text


@pytest.mark.slow  # real processes: the old queue's worker and distsched's
@pytest.mark.sqlite_project
def test_migrating_from_django_q2_as_the_guide_says(project):
    # Before: django-q2 with its ORM broker, three tasks queued.
    project("old", "migrate", "--noinput")
    project(
        "old",
        "shell",
        "-c",
        "from django_q.tasks import async_task\nfor i in range(3): async_task('shop.tasks.add', i, 1)",
    )
    # Install distsched, switch TASKS, decorate the tasks: new calls are distsched runs.
    project("new", "migrate", "--noinput")
    assert status(project)["left"] == {"queued": 3, "locked": 0}
    text = project("new", "distsched", "migrate-status", "--from", "django-q2")
    assert text.startswith("django-q2: 3 task(s) left (queued 3, locked 0): keep its qcluster running")
    project("new", "shell", "-c", "from shop.tasks import add; add.enqueue(20, 22)")
    project("new", "runworker", "--burst", "--queues", "*")
    # The old qcluster (old code, old settings) drains its queue; migrate-status says when.
    cluster = project.spawn("old", "qcluster")
    try:
        deadline = time.monotonic() + BOOT
        while not status(project)["empty"] and time.monotonic() < deadline:
            time.sleep(0.5)  # polling another process, bounded by BOOT
        assert status(project)["empty"], "the qcluster did not drain its queue"
    finally:
        # To the cluster's own process, which stops its workers: sent to the whole process group at
        # once, the signal left it waiting a minute for children that were already gone.
        cluster.send_signal(signal.SIGTERM)
        try:
            cluster.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(cluster.pid, signal.SIGKILL)
            cluster.communicate()
        with contextlib.suppress(ProcessLookupError):  # none should be left; if one is, not for long
            os.killpg(cluster.pid, signal.SIGKILL)
    done = project("new", "shell", "-c", textwrap.dedent("""
        from django_q.models import Success
        from distsched_app.models import Run
        print(sorted(Success.objects.values_list("result", flat=True)), [r.result for r in Run.objects.all()])
    """)).strip().splitlines()[-1]  # fmt: skip
    assert done == "[1, 2, 3] [42]"
    assert project("new", "distsched", "migrate-status", "--from", "django-q2").startswith(
        "django-q2: the old queue is empty (queued 0, locked 0): stop its qcluster"
    )


# The guide's "Schedules": django-q2 rows of each type, as django_q.tasks.schedule() and its admin
# store them (args and kwargs as Python literals; the admin's "a=1, b=2" form).
Q2_SCHEDULES = """
from datetime import datetime, timedelta, timezone as tz
from django.utils import timezone
from django_q.models import Schedule as Q

now = timezone.now()
rows = [
    dict(name="Add once", schedule_type=Q.ONCE, args="(1, 2)", next_run=now - timedelta(minutes=1)),
    dict(name="Every five", schedule_type=Q.MINUTES, minutes=5, args="(10, 5)", next_run=now - timedelta(seconds=10)),
    dict(name="Hourly", schedule_type=Q.HOURLY, kwargs="{'a': 1, 'b': 2}", next_run=now + timedelta(hours=1),
         cluster="io"),
    dict(name="Weekly", schedule_type=Q.WEEKLY, kwargs="a=3, b=4", next_run=datetime(2030, 1, 6, 2, 30, tzinfo=tz.utc)),
    dict(name="Monthly", schedule_type=Q.MONTHLY, args="7", next_run=datetime(2030, 1, 15, 23, 5, tzinfo=tz.utc),
         hook="shop.hooks.done"),
    dict(name="Nightly", schedule_type=Q.CRON, cron="0 3 * * *", args="(0, 0)", repeats=4),
    dict(name="Fortnightly", schedule_type=Q.BIWEEKLY, args="(0, 0)"),
    dict(name="Used up", schedule_type=Q.DAILY, args="(0, 0)", repeats=0),
]
for row in rows:
    Q.objects.create(func="shop.tasks.add", **row)
"""
PARIS = ZoneInfo("Europe/Paris")
RUNS = (
    "import json\nfrom distsched_app.models import Run\n"
    "print(json.dumps(sorted([r.schedule.name if r.schedule else r.origin, r.state, r.result, r.queue] "
    "for r in Run.objects.all())))"
)


def guide_schedule_script() -> str:
    blocks = re.findall(r"^```python\n(.*?)^```$", GUIDE.read_text(), re.MULTILINE | re.DOTALL)
    [script] = [b for b in blocks if b.startswith("# q2_schedules.py")]
    return script


@pytest.mark.slow  # real processes: the guide's script, apply, a tick and a worker
@pytest.mark.sqlite_project
def test_the_guides_schedules_step_translates_applies_and_runs_django_q2_schedules(project, tmp_path):
    (tmp_path / "new" / "settings.py").write_text(NEW_SETTINGS + "TIME_ZONE = 'Europe/Paris'\n")
    project("old", "migrate", "--noinput")
    project("old", "shell", "-c", Q2_SCHEDULES)
    project("new", "migrate", "--noinput")
    # python manage.py shell < q2_schedules.py, as the guide says.
    out = project("new", "shell", stdin=guide_schedule_script())
    assert [line for line in out.splitlines() if line.strip() and "automatically" not in line] == [  # Django 5.2+
        "5 schedule(s) written to schedules.json",
        "note: add-once: its time has passed and it has not run; to run it now: "
        "python manage.py distsched run enqueue shop.tasks.add --args '[1, 2]'",
        "note: monthly: hook shop.hooks.done not carried over (use the task_finished signal)",
        "note: nightly: 4 run(s) left in django-q2; pause or delete it when done",
        "note: fortnightly: schedule type Biweekly has no equivalent",
        "note: used-up: no runs left (repeats=0)",
    ]
    declared = json.loads((tmp_path / "schedules.json").read_text())
    without_times = {name: {k: v for k, v in e.items() if k != "start_at"} for name, e in declared.items()}
    add, paris = {"task": "shop.tasks.add"}, {"timezone": "Europe/Paris"}
    assert without_times == {
        "every-five": {**add, "args": [10, 5], "kwargs": {}, "interval_seconds": 300},
        "hourly": {**add, "args": [], "kwargs": {"a": 1, "b": 2}, "interval_seconds": 3600, "queue": "io"},
        # 02:30 UTC on Sunday 6 January 2030 is 03:30 in Paris; 23:05 UTC on the 15th is 00:05 on the 16th.
        "weekly": {**add, "args": [], "kwargs": {"a": 3, "b": 4}, "cron": "30 3 * * 0", **paris},
        "monthly": {**add, "args": [7], "kwargs": {}, "cron": "5 0 16 * *", **paris},
        "nightly": {**add, "args": [0, 0], "kwargs": {}, "cron": "0 3 * * *", **paris},
    }
    assert {name for name, e in declared.items() if "start_at" in e} == {"every-five", "hourly"}  # django-q2's next_run
    # apply --dry-run writes nothing; apply creates them; a second apply changes nothing.
    project("new", "distsched", "schedule", "apply", "--file", "schedules.json", "--dry-run")
    assert project("new", "distsched", "schedule", "list", "--json").strip() == "[]"
    project("new", "distsched", "schedule", "apply", "--file", "schedules.json")
    listed = {s["name"]: s for s in json.loads(project("new", "distsched", "schedule", "list", "--json"))}
    assert set(listed) == set(declared)
    assert listed["hourly"]["queue"] == "io"
    weekly = datetime.fromisoformat(listed["weekly"]["next_run_at"].replace("Z", "+00:00")).astimezone(PARIS)
    assert (weekly.isoweekday(), weekly.hour, weekly.minute) == (7, 3, 30)  # Sundays at 03:30 in Paris
    again = project("new", "distsched", "schedule", "apply", "--file", "schedules.json")
    assert "created" not in again and "updated" not in again
    # The overdue once, as the note says; the ticker makes the interval's first run; a worker runs both.
    [command] = [line.split("to run it now: ")[1] for line in out.splitlines() if "to run it now" in line]
    project("new", *shlex.split(command)[2:])
    project("new", "tick")
    project("new", "runworker", "--burst", "--queues", "*")
    ran = json.loads(project("new", "shell", "-c", RUNS).strip().splitlines()[-1])
    assert ran == [["enqueued", "succeeded", 3, "default"], ["every-five", "succeeded", 15, "default"]]
