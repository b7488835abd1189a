"""The README's one-minute tour, run as written in a fresh SQLite database of the ready-to-run project."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def tour_block() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## A one-minute tour\n", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"^```bash\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    return block


def test_the_tour_creates_ticks_and_runs_a_schedule(tmp_path: Path):
    block = tour_block()
    assert block.count(".venv/bin/python manage.py") == 5
    script = block.replace(".venv/bin/python", sys.executable)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONUNBUFFERED": "1",
        # The project's own settings (manage.py's default), on a database of this test.
        "DATABASE_URL": f"sqlite:///{tmp_path / 'tour.sqlite3'}",
    }
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "created schedule tour: every 60s, task demo.heartbeat" in done.stdout
    assert "created 1 run(s)" in done.stdout
    [finished] = [line for line in done.stderr.splitlines() if " INFO run finished " in line]
    assert "task=demo.heartbeat" in finished and "state=succeeded" in finished, done.stderr
    header, row = done.stdout.strip().splitlines()[-2:]
    assert header.split()[:4] == ["ID", "SCHEDULE", "TASK", "STATE"]
    assert row.split()[1:4] == ["tour", "demo.heartbeat", "succeeded"]
