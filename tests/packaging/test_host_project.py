"""The reusable app in someone else's project: wheel -> fresh venv -> startproject -> a run succeeds.

Follows the README's "Installing into an existing Django project" steps.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

SETTINGS_ADDITIONS = textwrap.dedent(
    """
    INSTALLED_APPS += [
        "rest_framework",
        "rest_framework.authtoken",
        "django_filters",
        "drf_spectacular",
        "drf_spectacular_sidecar",
        "distsched_app",
        "hostapp",
    ]
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": "PRAGMA journal_mode=WAL;",
    }
    REST_FRAMEWORK = {"DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema"}
    DISTSCHED = {"LEASE_SECONDS": 30}
    """
)

URLS = textwrap.dedent(
    """
    from django.contrib import admin
    from django.urls import include, path

    urlpatterns = [
        path("admin/", admin.site.urls),
        path("", include("distsched_app.urls")),
    ]
    """
)

TASKS = textwrap.dedent(
    """
    from distsched_app import task

    @task("host.hello")
    def hello(name):
        return f"hello {name}"
    """
)

SCRIPT = textwrap.dedent(
    """
    from distsched_app import Scheduler
    Scheduler().create_schedule(name="greet", task_name="host.hello", kwargs={"name": "host"}, interval_seconds=60)
    """
)

CHECK = textwrap.dedent(
    """
    from distsched_app.models import Run
    run = Run.objects.get()
    print(run.state, run.result, run.events.count())
    """
)


def clean_env() -> dict[str, str]:
    """The host project must not see this suite's settings or database."""
    drop = {"DJANGO_SETTINGS_MODULE", "DATABASE_URL", "PYTHONPATH", "VIRTUAL_ENV"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def run(cmd: list[str], cwd: Path, timeout: float = 600) -> str:
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=clean_env())
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


def test_wheel_installs_into_a_fresh_project_and_runs_a_task(tmp_path: Path):
    dist = tmp_path / "dist"
    run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(dist)], cwd=tmp_path)
    [wheel] = dist.glob("distsched-*.whl")
    listing = run([sys.executable, "-m", "zipfile", "-l", str(wheel)], cwd=tmp_path)
    package = ROOT / "distsched_app"
    shipped = [p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts
               and (p.suffix in {".html", ".css", ".js", ".svg"} or "migrations" in p.parts)]
    assert any("migrations" in p.parts for p in shipped)
    for path in shipped:
        name = path.relative_to(ROOT).as_posix()
        assert name in listing, f"{name} missing from the wheel"

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    python = str(venv / "bin" / "python")
    run([python, "-m", "pip", "install", "-q", str(wheel)], cwd=tmp_path)

    site = tmp_path / "site"
    site.mkdir()
    run([str(venv / "bin" / "django-admin"), "startproject", "host", str(site)], cwd=tmp_path)
    run([python, "manage.py", "startapp", "hostapp"], cwd=site)
    (site / "hostapp" / "tasks.py").write_text(TASKS)
    with (site / "host" / "settings.py").open("a") as settings:
        settings.write(SETTINGS_ADDITIONS)
    (site / "host" / "urls.py").write_text(URLS)

    run([python, "manage.py", "check"], cwd=site)
    run([python, "manage.py", "migrate", "-v", "0"], cwd=site)
    run([python, "manage.py", "shell", "-c", SCRIPT], cwd=site)
    assert "created 1 run(s)" in run([python, "manage.py", "tick"], cwd=site)
    run([python, "manage.py", "runworker", "--once", "--worker-id", "host-worker"], cwd=site)
    last_line = run([python, "manage.py", "shell", "-c", CHECK], cwd=site).strip().splitlines()[-1]
    assert last_line.split() == ["succeeded", "hello", "host", "4"]
