"""``manage.py runworker``: execute due runs until stopped."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError

from ... import checks
from ...errors import DistschedError
from ...services import declared_schedules
from ...text import storable
from ...worker import Worker, prefork
from ..base import DistschedCommand, int_up_to, positive_float, positive_int, queue_list

MAX_PROCESSES = 64


class Command(DistschedCommand):
    help = "Run a distsched worker: claim due runs with a lease, execute them, record the outcome."
    # Only distsched's own checks (settings ranges, SQLite transaction mode): the others load the URLconf
    # and with it the whole API stack, which a worker never serves; it would double the start-up time.
    requires_system_checks = [checks.TAG]

    def add_command_arguments(self, parser: Any) -> None:
        parser.add_argument("--worker-id", help="Stable id for this worker (default: host-pid-random).")
        parser.add_argument(
            "--queues",
            type=queue_list,
            default=None,
            help="Comma-separated queues to serve (default: default); '*' serves every queue.",
        )
        parser.add_argument(
            "--capability",
            action="append",
            default=None,
            metavar="NAME",
            help="A capability this worker offers (repeatable); runs of tasks that DISTSCHED['TASK_REQUIRES'] "
            "gives capabilities are claimed only by workers with all of them.",
        )
        parser.add_argument(
            "--lease-seconds",
            type=positive_float,
            default=None,
            help="Lease length; another worker may take a run after it expires.",
        )
        parser.add_argument(
            "--heartbeat-seconds", type=positive_float, default=None, help="Heartbeat and lease-renewal period."
        )
        parser.add_argument(
            "--poll-interval", type=positive_float, default=None, help="Seconds to wait when nothing is due."
        )
        parser.add_argument(
            "--prefetch",
            type=positive_int,
            default=None,
            help="Claim up to N runs per transaction while tasks are quick (default: PREFETCH, 128).",
        )
        parser.add_argument(
            "--concurrency",
            type=positive_int,
            default=1,
            help="Run up to N tasks at once in threads (for I/O-bound tasks).",
        )
        parser.add_argument(
            "--processes",
            type=int_up_to(MAX_PROCESSES),
            default=1,
            help="Set Django up once, then fork N worker processes and supervise them (forwards SIGTERM/SIGINT, "
            "restarts a child that dies). Each child is a full worker with its own id; --max-runs is per child.",
        )
        parser.add_argument("--with-tick", action="store_true", help="Also tick schedules (safe with several tickers).")
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument("--once", action="store_true", help="Execute at most one run, then exit 0.")
        mode.add_argument("--burst", action="store_true", help="Execute until nothing is due, then exit 0.")
        parser.add_argument(
            "--max-runs",
            type=positive_int,
            default=None,
            help="Exit after this many executions, whatever their outcome.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        processes = options["processes"]
        if processes > 1 and options["once"]:
            raise CommandError("--once executes one run in one process; it takes no --processes")
        # Bad options fail here, before any fork (with the longest id a child will have).
        worker = self.make_worker(options, self.child_id(options["worker_id"], processes - 1, processes))
        if options["with_tick"]:
            declared_schedules.apply_at_startup(worker.clock, process="worker")
        if processes == 1:
            self.serve(worker, options)
            return
        prefork.warm_up()
        supervisor = prefork.Supervisor(processes, lambda slot: self.child(slot, options), restart=not options["burst"])
        if supervisor.run():
            raise CommandError(f"a worker process failed (of {processes}); see the log above")

    def child(self, slot: int, options: dict[str, Any]) -> int:
        """One forked worker process: its own id (``<worker-id>-<n>`` when one is given)."""
        worker = self.make_worker(options, self.child_id(options["worker_id"], slot, options["processes"]))
        prefork.watch_parent(worker.request_stop)
        self.serve(worker, options)
        return 0

    @staticmethod
    def child_id(base: str | None, slot: int, processes: int) -> str | None:
        return f"{base}-{slot + 1}" if base and processes > 1 else base

    def make_worker(self, options: dict[str, Any], worker_id: str | None) -> Worker:
        try:
            return Worker(
                worker_id=worker_id,
                queues=options["queues"],
                capabilities=options["capability"],
                lease_seconds=options["lease_seconds"],
                heartbeat_seconds=options["heartbeat_seconds"],
                poll_interval=options["poll_interval"],
                with_tick=options["with_tick"],
                prefetch=options["prefetch"],
                concurrency=options["concurrency"],
            )
        except DistschedError as exc:
            raise CommandError(storable(str(exc))) from None

    def serve(self, worker: Worker, options: dict[str, Any]) -> None:
        if options["once"]:
            # At most one run, nothing due is fine; through run() so that SIGTERM
            # finishes the run gracefully and the stopped status is recorded.
            worker.run(max_runs=1, burst=True)
            return
        worker.run(max_runs=options["max_runs"], burst=options["burst"])
