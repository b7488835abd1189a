"""Helpers to run real worker and ticker processes against the test database."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def database_url() -> str:
    """A DATABASE_URL that points child processes at the current test database."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{Path(s['NAME']).resolve()}"
    user = s.get("USER") or "postgres"
    password = f":{s['PASSWORD']}" if s.get("PASSWORD") else ""
    host = s.get("HOST") or "127.0.0.1"
    port = s.get("PORT") or 5432
    return f"postgres://{user}{password}@{host}:{port}/{s['NAME']}"


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url(),
        DJANGO_SETTINGS_MODULE="tests.settings",
        PYTHONUNBUFFERED="1",
        DISTSCHED_LOG_LEVEL=env.get("DISTSCHED_LOG_LEVEL", "WARNING"),
    )
    env.update(extra)
    return env


def manage(*args: str, **popen_kwargs) -> subprocess.Popen:
    popen_kwargs.setdefault("stdout", subprocess.PIPE)
    popen_kwargs.setdefault("stderr", subprocess.PIPE)
    popen_kwargs.setdefault("text", True)
    env = popen_kwargs.pop("env", None) or child_env()
    return subprocess.Popen([sys.executable, str(ROOT / "manage.py"), *args], cwd=ROOT, env=env, **popen_kwargs)


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Poll with a bounded timeout (never an unbounded sleep)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def finish(procs: list[subprocess.Popen], timeout: float) -> list[tuple[int, str, str]]:
    """Wait for every process; kill stragglers. Returns (returncode, stdout, stderr)."""
    out = []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, stderr = p.communicate()
        out.append((p.returncode, stdout, stderr))
    return out


class LoggedProcesses:
    """Start ``manage.py`` children whose output goes to one log file each (read on failure)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.logs: dict[str, Path] = {}

    def spawn(self, name: str, *args: str) -> subprocess.Popen:
        self.logs[name] = self.directory / f"{name}.log"
        with self.logs[name].open("w") as log:
            return manage(*args, stdout=log, stderr=subprocess.STDOUT)


def received(listening, timeout: float = 2.0) -> list[str]:
    """Everything a ``notify.Listener`` got within ``timeout`` (returns early once something came and went quiet)."""
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = listening.wait(0.2 if got else max(0.0, deadline - time.monotonic()))
        if not batch and got:
            break
        got += batch
    return got
