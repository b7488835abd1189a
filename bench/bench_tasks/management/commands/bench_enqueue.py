"""``manage.py bench_enqueue --count N [--bulk | --trigger]``: time N enqueues, print one JSON line.

The first enqueue is a warm-up (connection, backend instance) and is not timed;
the other N-1 are, one ``noop.enqueue()`` call each in autocommit mode (each
call is its own transaction, as from a view or a script). Every statement sent
through Django's cursor during the timed part is counted by an
``execute_wrapper`` (COMMITs issued by the driver are not statements Django
executes, so they are not counted). ``--bulk`` times distsched's bulk enqueue
instead, when it exists; otherwise it enqueues nothing and says so.
``--trigger`` (distsched only) times N manual triggers of one schedule of the
same no-op task instead (``Scheduler.trigger``, as the API and admin call it).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import time
from collections import Counter

from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from bench_tasks.framework import task_backends
from bench_tasks.tasks import noop

# HOOK: distsched's bulk enqueue. Adapt `bulk_enqueue` to its final signature.
BULK_MODULE, BULK_FUNCTION = "distsched_app.services.enqueue", "enqueue_many"


def bulk_function():
    """distsched's bulk enqueue function, or None while it does not exist."""
    try:
        found = importlib.util.find_spec(BULK_MODULE)
    except ModuleNotFoundError:
        found = None
    if found is None:
        return None
    return getattr(importlib.import_module(BULK_MODULE), BULK_FUNCTION, None)


def bulk_enqueue(function, count: int) -> None:
    from distsched_app.clock import current_clock
    from distsched_app.services.enqueue import Job

    job = Job(task_name=noop.module_path, queue=noop.queue_name)
    function([job] * count, now=current_clock().now())


class Command(BaseCommand):
    help = "Enqueue --count no-op tasks through TASKS['default'] and print the timings as JSON."

    def add_arguments(self, parser):
        parser.add_argument("--count", type=int, required=True, help="Jobs to enqueue (the first one untimed).")
        parser.add_argument("--bulk", action="store_true", help="Use distsched's bulk enqueue if it exists.")
        parser.add_argument("--trigger", action="store_true", help="Time distsched's manual trigger instead.")

    def handle(self, *args, count: int, bulk: bool, trigger: bool, **options):
        if count < 1:
            raise CommandError("--count must be at least 1")
        one = noop.enqueue
        if trigger:
            from distsched_app import Scheduler
            from distsched_app.clock import current_clock

            scheduler = Scheduler()
            later = current_clock().now().replace(year=current_clock().now().year + 1)  # never due
            scheduler.create_schedule(
                name="bench-trigger", task_name=noop.module_path, interval_seconds=86400, start_at=later
            )

            def one():
                return scheduler.trigger("bench-trigger")

        backend = type(task_backends["default"])
        function = bulk_function() if bulk else None
        if bulk and function is None:
            skipped = f"{BULK_MODULE}.{BULK_FUNCTION} not importable"
            self.stdout.write(
                json.dumps(
                    {"backend": f"{backend.__module__}.{backend.__qualname__}", "mode": "bulk", "skipped": skipped}
                )
            )
            return
        one()  # warm-up, untimed
        timed = count - 1
        kinds: Counter[str] = Counter()

        def counting(execute, sql, params, many, context):
            kinds[sql.split(None, 1)[0].upper() if sql.strip() else "?"] += 1
            return execute(sql, params, many, context)

        with connection.execute_wrapper(counting):
            start = time.perf_counter()
            if function is not None:
                bulk_enqueue(function, timed)
            else:
                for _ in range(timed):
                    one()
            seconds = time.perf_counter() - start
        result = {
            "backend": f"{backend.__module__}.{backend.__qualname__}",
            "mode": "bulk" if function is not None else "trigger" if trigger else "one-by-one",
            "count": count,
            "timed": timed,
            "seconds": seconds,
            "per_s": timed / seconds if seconds else float("nan"),
            "ms_per": 1000 * seconds / timed if timed else float("nan"),
            "statements_per": sum(kinds.values()) / timed if timed else float("nan"),
            "statement_kinds": dict(kinds),
        }
        self.stdout.write(json.dumps(result))
