"""Counts the statements of an idle worker for ``bench/latency.py`` (``$BENCH_QUERY_COUNT_FILE``)."""

from __future__ import annotations

import os
import threading
import time

from django.apps import AppConfig


class BenchTasksConfig(AppConfig):
    name = "bench_tasks"

    def ready(self) -> None:
        path = os.environ.get("BENCH_QUERY_COUNT_FILE")
        if path:
            _count_statements(path)


def _count_statements(path: str) -> None:
    """Every statement any thread sends through a Django connection is counted; the total is
    written to ``path`` twice a second (``<monotonic time> <count>``), so the benchmark can take
    the difference over an idle window."""
    from django.db.backends.signals import connection_created

    lock = threading.Lock()
    count = [0]

    def counting(execute, sql, params, many, context):
        with lock:
            count[0] += 1
        return execute(sql, params, many, context)

    def install(sender, connection, **kwargs) -> None:
        if counting not in connection.execute_wrappers:
            connection.execute_wrappers.append(counting)

    connection_created.connect(install, weak=False)

    def report() -> None:
        while True:
            with lock:
                line = f"{time.monotonic():.3f} {count[0]}\n"
            with open(path, "w") as handle:
                handle.write(line)
            time.sleep(0.5)

    threading.Thread(target=report, name="bench-query-count", daemon=True).start()
