"""SIGTERM and SIGINT: the first stops claiming and finishes the runs in hand; a second exits at once."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import Worker

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def install(worker: Worker) -> Callable[[], None] | None:
    """Install the handlers (main thread only); returns a function restoring the previous ones."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}

    def handler(signum: int, frame: Any) -> None:
        if worker.stopping:
            # Second signal: leave now. Lease expiry recovers the runs we hold.
            worker.hard_stopped = True
            sys.stderr.write(f"distsched: second {signal.Signals(signum).name}, exiting now\n")
            sys.stderr.flush()
            os._exit(1)
        worker.request_stop()
        worker.log(logging.INFO, "stop requested; finishing current run", signal=signal.Signals(signum).name)

    for sig in SIGNALS:
        signal.signal(sig, handler)

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore
