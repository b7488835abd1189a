"""``manage.py tick``: turn due schedules into runs, once or in a loop."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from ... import checks
from ...clock import current_clock
from ...conf import conf
from ...db.retry import Backoff, is_transient, reset_connection
from ...services.tick import tick
from ..base import DistschedCommand, seconds_up_to

logger = logging.getLogger("distsched")


class Command(DistschedCommand):
    requires_system_checks = [checks.TAG]  # like runworker: distsched's own checks only (start-up time)
    help = "Create the runs of due schedules. Safe to run in several processes at once."

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
            created = tick(now=current_clock().now())
            self.stdout.write(f"created {len(created)} run(s)")
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
        while not stop.is_set():
            try:
                tick(now=current_clock().now())
            except Exception as exc:  # logged and retried with backoff: never stops the ticker
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
            stop.wait(interval)
