"""Instant wake-ups of an idle worker on PostgreSQL: a thread that listens and sets the worker's wake event.

Polling stays the safety net: the worker still wakes every ``poll_interval``, so
a lost notification costs at most one poll interval. A lost listening
connection is logged and re-established with backoff (plus jitter); after every
successful ``LISTEN`` the worker is woken once, for whatever was committed while
nobody listened. If notifications cannot reach this connection at all
(PgBouncer in transaction pooling mode), the listener says so once, names
``DISTSCHED["LISTEN_DATABASE_URL"]`` and stops: the worker polls.
"""

from __future__ import annotations

import logging
import random
import threading
from typing import TYPE_CHECKING

from ..db import notify
from .execute import describe_exception

if TYPE_CHECKING:
    from . import Worker

HEALTH_CHECK_SECONDS = 10.0
MAX_BACKOFF_SECONDS = 30.0


class Wakeup:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.wakeups = 0  # notifications that woke this worker (tests and logs read it)
        self.connected = threading.Event()  # set while a working listener is connected
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._listener: notify.Listener | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Listen in a thread, if this database can (PostgreSQL) and ``DISTSCHED["LISTEN"]`` is on."""
        from ..conf import conf

        if not (conf.LISTEN and notify.listening_supported()) or self._thread is not None:
            return
        self._dsn = notify.conninfo()  # read here: Django's connection settings belong to this thread
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"distsched-listen-{self.worker.worker_id}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            if self._listener is not None:
                self._listener.interrupt()
        if self._thread is not None:
            self._thread.join(timeout=15)
            self._thread = None

    def _run(self) -> None:
        w = self.worker
        failures = 0
        while not self._stop.is_set():
            try:
                listener = notify.Listener(self._dsn)
            except Exception as exc:  # noqa: BLE001 - the worker polls meanwhile
                failures += 1
                delay = min(MAX_BACKOFF_SECONDS, 0.1 * 2**failures) * random.uniform(0.5, 1.0)  # noqa: S311
                w.log(
                    logging.WARNING,
                    "cannot listen for wake-ups; retrying",
                    error=describe_exception(exc),
                    retry_in=f"{delay:.1f}",
                )
                self._stop.wait(delay)
                continue
            with self._lock:
                self._listener = listener
            try:
                if listener.behind_a_pooler() and not listener.probe():
                    w.log(logging.WARNING, "notifications do not reach this connection (a pooler such as PgBouncer "
                          "in transaction mode?): polling only; set DISTSCHED['LISTEN_DATABASE_URL'] to a direct "
                          "connection for instant wake-ups")  # fmt: skip
                    return
                if failures:
                    w.log(logging.INFO, "listening for wake-ups again", after_failures=failures)
                failures = 0
                self.connected.set()
                w.wake()  # anything committed while nobody listened
                self._listen(listener)
            except Exception as exc:  # noqa: BLE001 - reconnect with backoff; the worker polls meanwhile
                failures += 1
                self.connected.clear()
                delay = min(MAX_BACKOFF_SECONDS, 0.1 * 2**failures) * random.uniform(0.5, 1.0)  # noqa: S311
                w.log(
                    logging.WARNING,
                    "lost the wake-up connection; reconnecting",
                    error=describe_exception(exc),
                    retry_in=f"{delay:.1f}",
                )
                self._stop.wait(delay)
            finally:
                self.connected.clear()
                with self._lock:
                    self._listener = None
                listener.close()

    def _listen(self, listener: notify.Listener) -> None:
        queues = set(self.worker.queues)
        while not self._stop.is_set():
            notified = listener.wait(HEALTH_CHECK_SECONDS)
            if self._stop.is_set():
                return
            if not notified:
                listener.health_check()
            elif queues.intersection(notified):
                self.wakeups += 1
                self.worker.wake()
