"""What notifications from anyone cost an idle PostgreSQL worker, and that lease recovery goes on.

    .venv/bin/python bench/notify_storm.py --db postgres                # ~30 s
    .venv/bin/python bench/notify_storm.py --db postgres --seconds 10

Anyone who can connect can ``NOTIFY distsched_wakeup`` with a served queue's
name. One idle ``runworker`` (poll 1 s) is measured for ``--seconds`` each:
quiet, under a trickle of 2 notifications a second, and under a storm (one
connection notifying as fast as it can). Printed: notifications sent, the
worker's CPU (user + system, from ``/proc``) as a share of one core, and, for
the trickle and the storm, how long a run left ``running`` by a dead worker
(its lease expired) took to be recovered and run.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from pathlib import Path

import _common as c

NAME = "notify_storm"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Notifier(threading.Thread):
    def __init__(self, url: str, every: float) -> None:
        super().__init__(daemon=True)
        self.url, self.every, self.sent, self.stop = url, every, 0, threading.Event()

    def run(self) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop.is_set():
                conn.execute("SELECT pg_notify('distsched_wakeup', 'default')")
                self.sent += 1
                if self.every:
                    self.stop.wait(self.every)


def abandoned_run() -> int:
    """A run a dead worker left ``running``, its lease expired a second ago."""
    from django.db import transaction
    from django.utils import timezone

    from distsched_app.models import Run, RunState
    from distsched_app.services.enqueue import Job, enqueue

    now = timezone.now()
    with transaction.atomic():  # abandoned before anyone can claim it
        run = enqueue(Job(task_name=c.TASK), now=now)
        Run.objects.filter(pk=run.pk).update(
            state=RunState.RUNNING, lease_owner="dead-worker", attempts=1, lease_expires_at=now - timedelta(seconds=1)
        )
    return run.pk


def recovered(run_id: int) -> bool:
    from distsched_app.models import Run, RunState

    return Run.objects.get(pk=run_id).state == RunState.SUCCEEDED


def main() -> None:
    p = c.parser(__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=8.0, help="Length of each phase (default 8).")
    args = p.parse_args()
    if args.db != "postgres":
        p.error("notifications are PostgreSQL's: use --db postgres")
    with c.scratch_database(NAME, args) as url:
        c.header("an idle worker under notifications", args)
        log = c.scratch_dir(NAME) / "worker.log"
        worker = c.spawn(c.worker_command(worker_id="idle", poll_interval=1.0, burst=False, extra=[]), log)
        time.sleep(3.0)  # Django start-up and the first LISTEN (not a wait for the scheduler)
        rows = []
        for label, every in (("quiet", None), ("trickle, 2/s", 0.5), ("storm", 0.0)):
            notifier = Notifier(url.replace("postgres://", "postgresql://"), every or 0.0)
            run_id = abandoned_run() if every is not None else None
            before, start = cpu_seconds(worker.pid), time.monotonic()
            if every is not None:
                notifier.start()
            took = None
            if run_id is not None and c.wait_for(lambda r=run_id: recovered(r), timeout=args.seconds):
                took = time.monotonic() - start
            time.sleep(max(0.0, args.seconds - (time.monotonic() - start)))
            notifier.stop.set()
            if every is not None:
                notifier.join()
            share = (cpu_seconds(worker.pid) - before) / (time.monotonic() - start)
            recovery = "" if run_id is None else ("not recovered" if took is None else f"{took:.2f} s")
            rows.append([label, notifier.sent, f"{100 * share:.1f}%", recovery])
        print(c.table(["phase", "notifications", "worker CPU (one core)", "expired lease recovered after"], rows))
        c.write_results(NAME, args, {"rows": rows})


if __name__ == "__main__":
    main()
