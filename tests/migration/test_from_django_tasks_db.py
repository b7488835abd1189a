"""docs/howto/migrate-django-tasks-db.md, followed step by step in real processes: a project on
django-tasks-db with tasks waiting, distsched installed beside it, the backend switched, the old
queue drained by the old worker while distsched runs the new tasks, then django-tasks-db removed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "howto" / "migrate-django-tasks-db.md"

pytestmark = pytest.mark.skipif(
    __import__("importlib.util").util.find_spec("django_tasks_db") is None,
    reason="django-tasks-db is not installed (requirements.txt installs it)",
)

SHOP_TASKS = """
try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task
def add(a, b):
    return a + b


@task(queue_name="emails")
def send(to):
    return f"sent to {to}"
"""

# The settings of each stage: the project's own (scheduler_project) as the base.
SETTINGS = {
    # Before: django-tasks-db is the backend; distsched is not installed.
    "old_settings": """
        INSTALLED_APPS = [a for a in INSTALLED_APPS if a not in DISTSCHED_APPS] + ["django_tasks_db", "shop"]
        TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default", "emails"]}}
    """,
    # Steps 1 and 2: distsched installed beside it, and the backend changed.
    "new_settings": """
        INSTALLED_APPS = [*INSTALLED_APPS, "django_tasks_db", "shop"]
        TASKS = {
            "default": {
                "BACKEND": "distsched_app.backends.DistschedBackend",
                "QUEUES": ["default", "emails"],
                "OPTIONS": {"MAX_ATTEMPTS": 3, "RETRY_BASE_SECONDS": 10},
            }
        }
    """,
    # Step 4: django-tasks-db removed.
    "final_settings": """
        INSTALLED_APPS = [*INSTALLED_APPS, "shop"]
        TASKS = {"default": {"BACKEND": "distsched_app.backends.DistschedBackend", "QUEUES": ["default", "emails"]}}
    """,
}


@pytest.fixture
def project(tmp_path: Path):
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "shop" / "tasks.py").write_text(SHOP_TASKS)
    (tmp_path / "empty_urls.py").write_text("urlpatterns = []\n")
    for name, body in SETTINGS.items():
        (tmp_path / f"{name}.py").write_text(
            "from scheduler_project.settings import *  # noqa\n"
            "DISTSCHED_APPS = ('distsched_app', 'examples.demo', 'rest_framework', 'rest_framework.authtoken', "
            "'django_filters', 'drf_spectacular', 'drf_spectacular_sidecar')\n"
            "ROOT_URLCONF = 'empty_urls'\n" + textwrap.dedent(body)
        )

    def manage(settings: str, *argv: str, ok: bool = True) -> subprocess.CompletedProcess:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": f"{tmp_path}:{ROOT}",
            "DJANGO_SETTINGS_MODULE": settings,
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
        if ok:
            assert done.returncode == 0, f"{argv}: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        return done

    return manage


def shell(code: str) -> tuple[str, ...]:
    return ("shell", "-c", textwrap.dedent(code))


def test_the_guide_names_the_steps_this_test_follows():
    text = GUIDE.read_text()
    for step in ("## 1. Install distsched beside it", "## 2. Change the backend", "## 4. Remove django-tasks-db"):
        assert step in text
    assert "python manage.py distsched migrate-status --from django-tasks-db" in text
    assert '"BACKEND": "distsched_app.backends.DistschedBackend",  # was "django_tasks_db.DatabaseBackend"' in text


@pytest.mark.slow  # real processes: the old queue's worker and distsched's
@pytest.mark.sqlite_project
def test_migrating_from_django_tasks_db_as_the_guide_says(project):
    # Before: a project on django-tasks-db, with tasks waiting in its queue.
    project("old_settings", "migrate", "--noinput")
    project("old_settings", *shell("""
        from shop.tasks import add, send
        add.enqueue(1, 2); add.enqueue(3, 4); send.enqueue("ann@example.com")
    """))  # fmt: skip
    # 1. Install distsched beside it: migrate.  2. Change the backend.
    project("new_settings", "migrate", "--noinput")
    status = project("new_settings", "distsched", "migrate-status", "--from", "django-tasks-db").stdout
    assert status.startswith("django-tasks-db: 3 task(s) left (READY 3, RUNNING 0): keep its db_worker running")
    # 3. Deploy: new enqueues are distsched runs; a db_worker started with the new settings refuses to start...
    refused = project("new_settings", "db_worker", "--batch", ok=False)
    assert refused.returncode != 0 and "is not a database backend" in refused.stderr
    project("new_settings", *shell("from shop.tasks import add; print(add.enqueue(20, 22).id)"))
    assert project("new_settings", "runworker", "--queues", "default,emails", "--burst").returncode == 0
    # ... so the old worker, started with the old settings, drains the old queue.
    project("old_settings", "db_worker", "--batch", "--queue-name", "default,emails")
    status = project("new_settings", "distsched", "migrate-status", "--from", "django-tasks-db").stdout
    assert status.startswith("django-tasks-db: the old queue is empty (READY 0, RUNNING 0)")
    # 4. Remove django-tasks-db: the project still checks, and the status still reads the table.
    project("final_settings", "check")
    results = project("final_settings", *shell("""
        from distsched_app.models import Run
        from shop.tasks import add
        run = Run.objects.get()
        print(run.state, run.backend, add.get_result(str(run.pk)).return_value)
    """)).stdout  # fmt: skip
    assert results.strip().splitlines()[-1].split() == ["succeeded", "default", "42"]
    empty = project("final_settings", "distsched", "migrate-status", "--from", "django-tasks-db", "--json").stdout
    assert '"empty": true' in empty and '"table_exists": true' in empty
