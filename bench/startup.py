"""What a worker process costs before its first run, beside the floors below it.

    .venv/bin/python bench/startup.py --db sqlite --repeat 5
    .venv/bin/python bench/startup.py --db postgres --settings bench_tasks.peers_settings

Medians over ``--repeat`` fresh processes (wall time from spawning each):

- ``python -c pass`` and ``import django; django.setup()`` with the settings: the floors
  no Django worker can start under;
- ``manage.py runworker --help``: the command's own imports;
- spawn -> the worker's ``worker started`` line, and -> its first ``run finished`` line
  (``runworker --burst`` over ``--runs`` queued no-op runs, INFO logging), as
  ``peers.py``'s "spawn -> first job" counts it.

The raw loop of ``peers.py`` starts in about the first floor; the gap between the floors and
the worker's lines is what distsched itself adds.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from datetime import datetime

import _common as c

NAME = "startup"
LINE = re.compile(r"(\S+Z) INFO (worker started|run finished)")


def _timed(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=c.ROOT)
    return time.perf_counter() - started


def _worker_lines(runs: int) -> tuple[float, float]:
    """Seconds from spawn to the ``worker started`` line and to the first ``run finished`` line."""
    from distsched_app.services.enqueue import Job, enqueue

    for _ in range(runs):
        enqueue(Job(task_name=c.TASK), now=c.now())
    env = {**os.environ, "DISTSCHED_LOG_LEVEL": "INFO"}
    command = [sys.executable, "manage.py", "runworker", "--burst", "--poll-interval", "0.05"]
    spawned = time.time()
    out = subprocess.run(command, check=True, capture_output=True, text=True, cwd=c.ROOT, env=env)
    stamps: dict[str, float] = {}
    for line in (out.stderr + out.stdout).splitlines():
        found = LINE.match(line)
        if found and found.group(2) not in stamps:
            stamps[found.group(2)] = datetime.fromisoformat(found.group(1).replace("Z", "+00:00")).timestamp()
    if len(stamps) != 2:
        raise SystemExit(f"the worker's log lacks 'worker started' or 'run finished':\n{out.stderr[-2000:]}")
    return stamps["worker started"] - spawned, stamps["run finished"] - spawned


def main() -> None:
    p = c.parser(__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--runs", type=int, default=200, help="Queued no-op runs per worker start (default 200).")
    p.add_argument("--settings", default="tests.settings", help="DJANGO_SETTINGS_MODULE (default tests.settings).")
    args = p.parse_args()
    bench_dir = str(c.ROOT / "bench")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [bench_dir, str(c.ROOT), os.environ.get("PYTHONPATH")]))
    with c.scratch_database(NAME, args, settings=args.settings):
        c.header(f"worker start-up, medians of {args.repeat}", args)
        floors = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "import django; django.setup()": [sys.executable, "-c", "import django; django.setup()"],
            "manage.py runworker --help": [sys.executable, "manage.py", "runworker", "--help"],
        }
        times: dict[str, list[float]] = {label: [] for label in floors}
        started: list[float] = []
        first: list[float] = []
        for _ in range(args.repeat):
            for label, command in floors.items():
                times[label].append(_timed(command))
            ready, done = _worker_lines(args.runs)
            started.append(ready)
            first.append(done)
        rows = [(label, f"{c.median(v):.3f}", f"{min(v):.3f}") for label, v in times.items()]
        rows.append(("spawn -> 'worker started'", f"{c.median(started):.3f}", f"{min(started):.3f}"))
        rows.append(("spawn -> first 'run finished'", f"{c.median(first):.3f}", f"{min(first):.3f}"))
        print(c.table(["", "median s", "min s"], rows))
        print("load " + ", ".join(f"{x:.1f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
