"""``manage.py tick``: turn due schedules into runs, once or in a loop."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from django.db import InterfaceError, OperationalError, connection

from ...clock import current_clock
from ...conf import conf
from ...services.tick import tick
from ..base import DistschedCommand, seconds_up_to

logger = logging.getLogger("distsched")


class Command(DistschedCommand):
    help = "Create the runs of due schedules. Safe to run in several processes at once."

    def add_command_arguments(self, parser: Any) -> None:
        parser.add_argument("--loop", action="store_true", help="Keep ticking until SIGTERM/SIGINT.")
        parser.add_argument("--interval", type=seconds_up_to(3600), default=None,
                            help="Seconds between ticks with --loop (default: POLL_INTERVAL).")

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
        backoff = interval
        while not stop.is_set():
            try:
                tick(now=current_clock().now())
                backoff = interval
            except (OperationalError, InterfaceError) as exc:
                logger.warning("database error in tick loop; backing off",
                               extra={"distsched": {"error": str(exc), "retry_in": backoff}})
                connection.close()
                backoff = min(backoff * 2, 30.0)
            stop.wait(backoff)
