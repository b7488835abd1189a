"""Where a latency probe says it started: one line appended to ``$BENCH_LATENCY_FILE``.

An ``O_APPEND`` write of one short line is atomic, so probes of several worker
processes never interleave; the benchmark reads the file as it grows.
"""

from __future__ import annotations

import os
import time


def record(key: str) -> None:
    started = time.time()
    path = os.environ.get("BENCH_LATENCY_FILE")
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{key} {started:.6f}\n".encode())
    finally:
        os.close(fd)
