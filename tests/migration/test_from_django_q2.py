"""docs/howto/migrate-django-q2.md, followed in real processes: a project on django-q2 (ORM broker)
with tasks queued, the functions decorated with the framework's @task and distsched as backend, new
calls run by distsched while the old qcluster drains its queue, ``distsched migrate-status --from
django-q2`` saying when it is empty."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

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

    def manage(release: str, *argv: str) -> str:
        done = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *argv],
            cwd=tmp_path,
            env=env(release),
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
        os.killpg(cluster.pid, signal.SIGTERM)
        try:
            cluster.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(cluster.pid, signal.SIGKILL)
            cluster.communicate()
    done = project("new", "shell", "-c", textwrap.dedent("""
        from django_q.models import Success
        from distsched_app.models import Run
        print(sorted(Success.objects.values_list("result", flat=True)), [r.result for r in Run.objects.all()])
    """)).strip().splitlines()[-1]  # fmt: skip
    assert done == "[1, 2, 3] [42]"
    assert project("new", "distsched", "migrate-status", "--from", "django-q2").startswith(
        "django-q2: the old queue is empty (queued 0, locked 0): stop its qcluster"
    )
