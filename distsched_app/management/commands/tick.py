"""``manage.py tick``: turn due schedules into runs, once or in a loop.

With ``--loop`` the process campaigns for leadership (``services.leader_chores``): only
the leader ticks and runs the periodic chores; the others stand by, trying to take
over about once a second. A single ``tick`` (no ``--loop``) ticks at once, unelected:
the unique constraint on a run's slot keeps it single either way.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ... import checks
from ...clock import current_clock
from ...conf import conf
from ...db.retry import Backoff, is_transient, reset_connection
from ...services import declared_schedules
from ...services.leader import campaigner_id
from ...services.leader_chores import Leadership
from ...services.tick import tick
from ...services.workers import database_label
from ..base import DistschedCommand, seconds_up_to

logger = logging.getLogger("distsched")

# A ticker that has nothing to do says so this often, so a silent log means a dead ticker.
SUMMARY_EVERY_SECONDS = 60.0


@dataclass(kw_only=True)
class Tally:
    """What a tick loop did since ``since``: ticks, runs they created, ticks that failed."""

    since: datetime
    ticks: int = 0
    runs_created: int = 0
    failed_ticks: int = 0

    def fields(self, now: datetime) -> dict[str, Any]:
        seconds = round((now - self.since).total_seconds(), 1)
        return {
            "ticks": self.ticks,
            "runs_created": self.runs_created,
            "failed_ticks": self.failed_ticks,
            "seconds": seconds,
        }

    def add(self, *, runs: int = 0, failed: bool = False) -> None:
        self.ticks += 1
        self.runs_created += runs
        self.failed_ticks += int(failed)


class Command(DistschedCommand):
    requires_system_checks = [checks.TAG]  # like runworker: distsched's own checks only (start-up time)
    help = (
        "Create the runs of due schedules. With --loop, several processes elect one leader "
        "that ticks; the others stand by."
    )

    def add_command_arguments(self, parser: Any) -> None:
        parser.add_argument("--loop", action="store_true", help="Keep ticking until SIGTERM/SIGINT.")
        parser.add_argument(
            "--interval",
            type=seconds_up_to(3600),
            default=None,
            help="Seconds between ticks with --loop (default: POLL_INTERVAL).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["interval"] is not None and not options["loop"]:
            self.stderr.write("--interval only applies with --loop; ticking once")
        if not options["loop"]:
            once = tick(now=current_clock().now())
            self.stdout.write(f"created {len(once)} run(s)")
            return
        interval = options["interval"] or conf.POLL_INTERVAL
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        # Transient database errors (connection lost, database locked) wait 2x, 4x, ... the
        # interval, at most 30 s, then tick again on a fresh connection. Any other error is
        # logged with its traceback and waited out the same way: a ticker that exits stops
        # every schedule, so it never does until asked to.
        backoff = Backoff(initial=min(interval * 2, 30.0), maximum=30.0)
        clock = current_clock()
        started = clock.now()
        total, period = Tally(since=started), Tally(since=started)
        holder = campaigner_id()
        leadership = Leadership(holder=holder, figures_clock=clock.now)
        logger.info(
            "ticker started",
            extra={
                "distsched": {"database": database_label(), "interval": interval, "pid": os.getpid(), "holder": holder}
            },
        )
        declared_schedules.apply_at_startup(clock, process="ticker")
        while not stop.is_set():
            now = clock.now()  # read once per tick: the tick and the summary's period use it
            if (now - period.since).total_seconds() >= SUMMARY_EVERY_SECONDS:
                logger.info("ticker summary", extra={"distsched": period.fields(now)})
                period = Tally(since=now)
            try:
                created = leadership.turn(now)
            except Exception as exc:  # logged and retried with backoff: never stops the ticker
                total.add(failed=True)
                period.add(failed=True)
                delay = backoff.next_delay()
                if is_transient(exc):
                    logger.warning(
                        "database error in tick loop; backing off",
                        extra={"distsched": {"error": str(exc), "retry_in": delay}},
                    )
                else:
                    logger.error(
                        "tick failed; backing off",
                        exc_info=True,
                        extra={"distsched": {"error": f"{type(exc).__name__}: {exc}", "retry_in": delay}},
                    )
                reset_connection()
                stop.wait(delay)
                continue
            backoff.reset()
            if created is not None:  # this process leads: it ticked
                total.add(runs=len(created))
                period.add(runs=len(created))
            stop.wait(leadership.wait_seconds(interval))
        try:
            leadership.stop()
        finally:
            logger.info("ticker stopped", extra={"distsched": {**total.fields(clock.now()), "pid": os.getpid()}})
