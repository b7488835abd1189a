"""Plumbing of ``bench/tasks_framework.py``: the peer's environment, one adapter per system.

The client code both systems run lives in ``bench/bench_tasks`` (settings, the
``noop`` task, the ``bench_enqueue`` command); child processes find it through
``PYTHONPATH`` and pick their backend with ``BENCH_TASKS_SYSTEM``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import _common as c

BENCH = c.ROOT / "bench"
SETTINGS = "bench_tasks.settings"
NOT_BUILT = "distsched_app.backends not found: the backend is not built yet"


# -- environment ---------------------------------------------------------------


def venv_path() -> Path:
    return Path(f"/tmp/bench-venv-{sys.version_info.major}.{sys.version_info.minor}")


PEER_MODULES = ("django_tasks_db",)


def _has_packages(modules: tuple[str, ...]) -> bool:
    if not all(importlib.util.find_spec(m) for m in ("django", "dj_database_url", *modules)):
        return False
    import django

    return django.VERSION >= (6, 0) or importlib.util.find_spec("django_tasks") is not None


def ensure_packages(argv: list[str], modules: tuple[str, ...] = PEER_MODULES) -> None:
    """Re-run this script under ``/tmp/bench-venv-X.Y`` if this interpreter lacks the peer's packages.

    The venv is created on first use from ``requirements.txt`` (on Python >= 3.12
    with its Django pin raised to Django 6, as ``.ci/run`` does) plus
    ``bench/requirements.txt``, and reused afterwards. The project's ``.venv`` is
    never modified.
    """
    if _has_packages(modules):
        return
    venv = venv_path()
    wanted = (BENCH / "requirements.txt").read_text()
    marker = venv / ".bench-installed"
    if Path(sys.prefix).resolve() == venv.resolve():
        if marker.exists() and marker.read_text() != wanted:  # bench/requirements.txt changed: top it up
            subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "-r", str(BENCH / "requirements.txt")])
            marker.write_text(wanted)
            os.execv(sys.executable, [sys.executable, *argv])
        raise SystemExit(f"{venv} lacks one of {', '.join(modules)}: delete it and run again")
    if not marker.exists():
        print(f"creating {venv} (Django, django-tasks-db, django-tasks; once) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        requirements = (c.ROOT / "requirements.txt").read_text()
        if sys.version_info >= (3, 12):
            requirements = "\n".join(
                "Django>=6.0,<7" if line.startswith("Django") else line for line in requirements.splitlines()
            )
        (venv / "requirements.txt").write_text(requirements + "\n")
        subprocess.run(
            [
                str(venv / "bin" / "pip"),
                "install",
                "--quiet",
                "-r",
                str(venv / "requirements.txt"),
                "-r",
                str(BENCH / "requirements.txt"),
            ],
            check=True,
            cwd=c.ROOT,  # requirements.txt installs the checkout itself (-e .)
        )
        marker.write_text(wanted)
    python = str(venv / "bin" / "python")
    os.execv(python, [python, *argv])


def framework_versions() -> dict[str, str]:
    import django

    out = {"django": django.get_version(), "framework": "django.tasks" if django.VERSION >= (6, 0) else "django-tasks"}
    for package in ("django-tasks", "django-tasks-db"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = ""
    return out


def distsched_backend_exists() -> bool:
    return importlib.util.find_spec("distsched_app.backends") is not None


# -- the two systems -----------------------------------------------------------


class System:
    """What differs between the systems: backend, worker command, where results live."""

    name = label = ""
    succeeded = ""  # the state of a job that ran to success

    @property
    def env(self) -> dict[str, str]:
        return {"BENCH_TASKS_SYSTEM": self.name}

    def worker(self, worker_id: str) -> list[str]:
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError

    def finished(self) -> int:
        """Jobs in a final state (succeeded or failed for good)."""
        raise NotImplementedError

    def check(self, expected: int) -> tuple[dict[str, int], list[str]]:
        """States, and what is wrong (every job must have succeeded)."""
        raise NotImplementedError

    def window(self) -> tuple[datetime | None, datetime | None]:
        """First start and last finish, from the rows' own timestamps."""
        raise NotImplementedError


class Peer(System):
    name, label, succeeded = "peer", "django-tasks-db", "SUCCESSFUL"

    def worker(self, worker_id: str) -> list[str]:
        return [
            "db_worker",
            "--batch",
            "--no-reload",
            "--no-startup-delay",
            "--interval",
            "0",
            "--queue-name",
            "*",
            "--worker-id",
            worker_id,
            "-v",
            "0",
        ]

    def _rows(self):
        from django_tasks_db.models import DBTaskResult

        return DBTaskResult.objects.order_by()

    def reset(self) -> None:
        self._rows().delete()

    def finished(self) -> int:
        return self._rows().filter(status__in=["SUCCESSFUL", "FAILED"]).count()

    def check(self, expected: int) -> tuple[dict[str, int], list[str]]:
        from django.db.models import Count

        states = {r["status"]: r["n"] for r in self._rows().values("status").annotate(n=Count("id"))}
        problems = [] if states == {"SUCCESSFUL": expected} else [f"states {states}, expected {expected} SUCCESSFUL"]
        return states, problems

    def window(self) -> tuple[datetime | None, datetime | None]:
        from django.db.models import Max, Min

        got = self._rows().aggregate(first=Min("started_at"), last=Max("finished_at"))
        return got["first"], got["last"]


class Distsched(System):
    name, label, succeeded = "distsched", "distsched", "succeeded"

    def worker(self, worker_id: str) -> list[str]:
        return c.worker_command(worker_id=worker_id, poll_interval=0.05, burst=True, extra=[])

    def reset(self) -> None:
        c.reset_tables()

    def finished(self) -> int:
        from distsched_app.models import TERMINAL_STATES, Run

        return Run.objects.filter(state__in=TERMINAL_STATES).count()

    def check(self, expected: int) -> tuple[dict[str, int], list[str]]:
        states = c.states()
        problems = [] if states == {"succeeded": expected} else [f"states {states}, expected {expected} succeeded"]
        events = c.event_coverage()
        for kind in ("created", "succeeded"):  # the run history distsched promises
            runs = events.get(kind, {}).get("runs", 0)
            if runs != expected:
                problems.append(f"{kind} events for {runs} runs, expected {expected}")
        return states, problems

    def window(self) -> tuple[datetime | None, datetime | None]:
        from django.db.models import Max, Min

        from distsched_app.models import Run

        got = Run.objects.aggregate(first=Min("started_at"), last=Max("finished_at"))
        return got["first"], got["last"]


SYSTEMS: dict[str, System] = {s.name: s for s in (Distsched(), Peer())}


# -- child processes -----------------------------------------------------------


def manage(system: System, *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(c.ROOT / "manage.py"), *args],
        cwd=c.ROOT,
        env={**os.environ, **system.env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def enqueue(system: System, count: int, *, bulk: bool = False, trigger: bool = False) -> dict[str, Any]:
    """Run ``manage.py bench_enqueue`` as ``system``; its JSON line, checked."""
    args = ["bench_enqueue", "--count", str(count), *(["--bulk"] if bulk else []), *(["--trigger"] if trigger else [])]
    done = manage(system, *args, timeout=max(300.0, count / 20))
    if done.returncode != 0:
        raise SystemExit(f"{system.label}: bench_enqueue failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    backend = result["backend"].rsplit(".", 1)[-1]
    expected = ("DistschedBackend", "DatabaseBackend")[system.name == "peer"]
    if backend != expected:
        raise SystemExit(f"{system.label}: enqueued through {result['backend']}, expected a {expected}")
    return result


def django_startup(system: System) -> float:
    """Wall time of ``manage.py version``: interpreter, settings, ``django.setup()``, exit."""
    start = time.perf_counter()
    done = manage(system, "version", timeout=120)
    if done.returncode != 0:
        raise SystemExit(f"manage.py version failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start
