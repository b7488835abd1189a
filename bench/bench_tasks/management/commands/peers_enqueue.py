"""``manage.py peers_enqueue --system S --count N``: N no-op enqueues, one call each, one JSON line.

``bench/peers.py``'s client loop. Each call is its own transaction (autocommit, as from
a script or a view outside ``atomic``) and is timed on its own (``perf_counter`` around
the call), so the median per call is reported beside the mean. The first call
(imports, connection, backend instance) is the warm-up: it is enqueued and counted,
not timed. The systems:

- ``distsched``: ``distsched_app.services.enqueue.enqueue(Job(task_name="tests.noop"), now=...)``,
  the call the framework backend and the API make (the ``Scheduler`` facade has no enqueue);
- ``framework``: ``bench_tasks.tasks.noop.enqueue()`` through ``TASKS["default"]``, which
  must be ``DistschedBackend`` (``BENCH_TASKS_SYSTEM=distsched``);
- ``q2``: django-q2's ``async_task("bench_tasks.plain.noop")`` (ORM broker);
- ``procrastinate``: ``noop.defer()`` of ``bench_tasks.procrastinate_tasks``.

Every statement sent through Django's cursor during the timed calls is counted by an
``execute_wrapper`` (the COMMIT psycopg or sqlite3 issue in autocommit is not one), and
so is every new database connection (``connection_created``): django-q2's broker calls
``close_old_connections()`` on each enqueue, which under ``CONN_MAX_AGE=0`` reconnects.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable

from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.db.backends.signals import connection_created

SYSTEMS = ("distsched", "framework", "q2", "procrastinate")


def enqueuer(system: str) -> Callable[[], object]:
    if system == "distsched":
        from distsched_app.clock import current_clock
        from distsched_app.services.enqueue import Job, enqueue

        clock = current_clock()
        job = Job(task_name="tests.noop")
        return lambda: enqueue(job, now=clock.now())
    if system == "framework":
        from bench_tasks.framework import task_backends
        from bench_tasks.tasks import noop

        backend = type(task_backends["default"])
        if backend.__name__ != "DistschedBackend":
            raise CommandError(f"TASKS['default'] is {backend.__module__}.{backend.__name__}, not DistschedBackend")
        return noop.enqueue
    if system == "q2":
        from django_q.tasks import async_task

        return lambda: async_task("bench_tasks.plain.noop")
    if system == "procrastinate":
        from bench_tasks.procrastinate_tasks import noop as procrastinate_noop

        return procrastinate_noop.defer
    raise CommandError(f"unknown system {system!r}")


class Command(BaseCommand):
    help = "Enqueue --count no-op jobs of one system, each call timed, and print the timings as JSON."

    def add_arguments(self, parser):
        parser.add_argument("--system", choices=SYSTEMS, required=True)
        parser.add_argument("--count", type=int, required=True, help="Jobs to enqueue (the first one untimed).")

    def handle(self, *args, system: str, count: int, **options):
        if count < 2:
            raise CommandError("--count must be at least 2")
        one = enqueuer(system)
        start = time.perf_counter()
        one()  # warm-up, untimed
        first_ms = (time.perf_counter() - start) * 1000
        kinds: Counter[str] = Counter()
        connects = [0]

        def counting(execute, sql, params, many, context):
            kinds[sql.split(None, 1)[0].upper() if sql.strip() else "?"] += 1
            return execute(sql, params, many, context)

        def connected(sender, connection, **kwargs) -> None:
            connects[0] += 1

        connection_created.connect(connected, weak=False)
        durations: list[float] = []
        clock = time.perf_counter
        with connection.execute_wrapper(counting):
            begin = clock()
            for _ in range(count - 1):
                t0 = clock()
                one()
                durations.append(clock() - t0)
            seconds = clock() - begin
        connection_created.disconnect(connected)
        durations.sort()
        timed = len(durations)
        half = timed // 2
        middle = durations[half] if timed % 2 else (durations[half - 1] + durations[half]) / 2
        self.stdout.write(
            json.dumps(
                {
                    "system": system,
                    "count": count,
                    "timed": timed,
                    "seconds": seconds,
                    "first_ms": first_ms,
                    "median_ms": 1000 * middle,
                    "p90_ms": 1000 * durations[min(timed - 1, int(timed * 0.9))],
                    "mean_ms": 1000 * seconds / timed,
                    "per_s": timed / seconds,
                    "statements_per": sum(kinds.values()) / timed,
                    "connects_per": connects[0] / timed,
                    "statement_kinds": dict(kinds),
                }
            )
        )
