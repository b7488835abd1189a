"""The production environment exactly as docs/deployment.md lists it, and fresh processes that use it."""

from __future__ import annotations

import os
import re
import secrets
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEPLOYMENT_DOC = ROOT / "docs" / "deployment.md"
KEY_PLACEHOLDER = "<paste the generated key>"


def documented_environment() -> dict[str, str]:
    """The variables of the doc's ``/etc/distsched/env`` block, with a generated key in place of its placeholder."""
    block = re.search(r"```sh\n# /etc/distsched/env\n(.*?)```", DEPLOYMENT_DOC.read_text(), re.DOTALL)
    assert block, "docs/deployment.md has no ```sh block starting with '# /etc/distsched/env'"
    variables = {}
    for line in block.group(1).splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            variables[name] = value
    assert variables["DJANGO_SECRET_KEY"] == KEY_PLACEHOLDER
    variables["DJANGO_SECRET_KEY"] = secrets.token_urlsafe(50)
    return variables


def fresh_env(variables: dict[str, str]) -> dict[str, str]:
    """``variables`` and ``PATH`` only: nothing of this test run (``DJANGO_SETTINGS_MODULE``, ...) leaks in."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONUNBUFFERED": "1", **variables}


def start(args: list[str], variables: dict[str, str]) -> subprocess.Popen:
    """``python <args>`` in the project directory with a fresh environment."""
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env=fresh_env(variables),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
