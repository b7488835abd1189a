"""Instant wake-ups of an idle worker on PostgreSQL: a thread that listens and sets the worker's wake event.

Polling stays the safety net: the worker still wakes every idle poll interval
(``poll_interval``, backing off to ``IDLE_POLL_MAX_SECONDS`` while this listener
works: ``pacing.IdleBackoff``), so a lost notification costs at most one of those. A lost listening
connection is logged and re-established with backoff (plus jitter); after every
successful ``LISTEN`` the worker is woken once, for whatever was committed while
nobody listened. If notifications cannot reach this connection at all
(PgBouncer in transaction pooling mode), the listener says so once, names
``DISTSCHED["LISTEN_DATABASE_URL"]`` and stops: the worker polls.

Wake-ups are debounced. Anyone who can connect can notify the channel, so a
notification is a hint, not a fact: after a wake-up whose claim found nothing
the next one waits at least ``MIN_SPACING_SECONDS``, doubling with every
further empty one up to ``MAX_SPACING_SECONDS``; one that found work resets
the spacing to zero. A notification that comes within the spacing wakes the
worker at its end (none is lost), and nothing is read meanwhile: those that
pile up are read in one go, so a storm costs an idle worker a few claims and
reads a second instead of a share of a core.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import TYPE_CHECKING

from ..db import notify
from .execute import describe_exception

if TYPE_CHECKING:
    from . import Worker

HEALTH_CHECK_SECONDS = 10.0
MAX_BACKOFF_SECONDS = 30.0
# The spacing of wake-ups after claims that found nothing (see the module docstring).
MIN_SPACING_SECONDS = 0.02
MAX_SPACING_SECONDS = 0.25


class Wakeup:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.wakeups = 0  # notifications that woke this worker (tests and logs read it)
        self.connected = threading.Event()  # set while a working listener is connected
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._listener: notify.Listener | None = None
        self._lock = threading.Lock()
        self._spacing = 0.0  # the least time between two wake-ups now (``settle``)
        self._last_wake = 0.0  # monotonic time of the last wake-up

    def settle(self, *, found_work: bool) -> None:
        """What the claim after a wake-up found: work resets the spacing, nothing widens it."""
        if found_work:
            self._spacing = 0.0
        else:
            self._spacing = min(MAX_SPACING_SECONDS, max(MIN_SPACING_SECONDS, 2 * self._spacing))

    def start(self) -> None:
        """Listen in a thread, if this database can (PostgreSQL) and ``DISTSCHED["LISTEN"]`` is on."""
        from ..conf import conf

        if not (conf.LISTEN and notify.listening_supported()) or self._thread is not None:
            return
        # Read here: Django's connection belongs to this thread. The runs' database by the name the
        # server gives it (Django's NAME may be a pooler's alias of it).
        self._database = notify.runs_database()
        self._dsn = notify.conninfo(self._database)
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
                if listener.database() != self._database:
                    w.log(logging.WARNING, "the wake-up connection is on another database than the runs: polling only; "
                          "check DISTSCHED['LISTEN_DATABASE_URL']", listening_on=listener.database(),
                          runs_in=self._database)  # fmt: skip
                    return
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
                continue
            if not queues.intersection(notified):
                continue
            hold = self._last_wake + self._spacing - time.monotonic()
            # Held back: nothing is read meanwhile, so what arrives piles up and is read at once.
            if hold > 0 and self._stop.wait(hold):
                return
            self._last_wake = time.monotonic()
            self.wakeups += 1
            self.worker.wake()
