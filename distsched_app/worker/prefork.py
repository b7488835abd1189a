"""Pre-fork: set Django up once, then fork K worker processes from it and supervise them.

A worker process spends about 0.3 s of CPU importing and setting up Django before its
first claim; K separate start-ups on a small machine queue behind each other, so K
workers were slower to get going than one. Forked after the set-up, each child starts
with everything imported (``runworker --processes K``, like gunicorn's arbiter or
django-q2's cluster).

The supervisor holds no database connection: it closes them all before forking, so no
child shares a socket. It forwards SIGTERM/SIGINT to the children (a first one finishes
the runs in hand, a second exits at once, as for one worker), restarts a child that
dies while serving (after a back-off if it dies young) and exits when every child has,
non-zero if one failed. Children run in their own process group, so a terminal's Ctrl-C
reaches the supervisor only and each child sees one signal per forwarded one.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from django.db import connection, connections

logger = logging.getLogger("distsched")

SIGNALS = (signal.SIGTERM, signal.SIGINT)
# A child that dies sooner than this after its start is restarted after a back-off
# (doubling up to MAX_RESTART_DELAY), so a broken deployment does not fork in a hot loop.
YOUNG_SECONDS = 10.0
FIRST_RESTART_DELAY = 0.5
MAX_RESTART_DELAY = 30.0
# How often a child checks that its supervisor is still there.
PARENT_CHECK_SECONDS = 1.0


def warm_up() -> None:
    """Load what every child would otherwise load on its first query (the database backend,
    its driver), then close the connections: the children inherit the imports, not the sockets."""
    connection.ensure_connection()
    connections.close_all()


def watch_parent(on_orphaned: Callable[[], None], interval: float = PARENT_CHECK_SECONDS) -> threading.Thread:
    """In a child: call ``on_orphaned`` once if the supervisor goes away (killed with SIGKILL,
    say), so no worker serves on unsupervised. A daemon thread; returns it."""
    parent = os.getppid()

    def loop() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        on_orphaned()

    thread = threading.Thread(target=loop, name="distsched-parent-watch", daemon=True)
    thread.start()
    return thread


class Supervisor:
    """Forks ``processes`` children running ``child(slot)`` (returns an exit code) and supervises them.

    ``restart``: restart a child that exits non-zero or is killed while not stopping (serving);
    a burst leaves the failure to the exit code instead."""

    def __init__(self, processes: int, child: Callable[[int], int], *, restart: bool) -> None:
        self.processes = processes
        self.child = child
        self.restart = restart
        self.children: dict[int, tuple[int, float]] = {}  # pid -> (slot, monotonic start)
        self.signals = 0  # SIGTERM/SIGINT received
        self.failed = False
        self.restarts = 0
        self._delays: dict[int, float] = {}  # slot -> the next restart's back-off

    @property
    def stopping(self) -> bool:
        return self.signals > 0

    def run(self) -> int:
        """Fork the children, wait for them all; 0 if every child ended cleanly."""
        connections.close_all()
        previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
        for sig in SIGNALS:
            signal.signal(sig, self._forward)
        try:
            for slot in range(self.processes):
                self._spawn(slot)
            self._log(logging.INFO, "worker processes started", pids=",".join(map(str, self.children)))
            while self.children:
                try:
                    pid, status = os.waitpid(-1, 0)
                except ChildProcessError:  # pragma: no cover - every child reaped already
                    break
                if pid in self.children:
                    self._reaped(pid, os.waitstatus_to_exitcode(status))
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
        self._log(logging.INFO, "worker processes stopped", restarts=self.restarts, failed=self.failed)
        return 1 if self.failed else 0

    # -- children -------------------------------------------------------------------

    def _spawn(self, slot: int) -> None:
        # Signals are held across the fork: a child must not run the supervisor's handler
        # (it would signal its siblings) before it has put the default ones back.
        signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
        try:
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child's side, measured by the process tests
                self._run_child(slot)
            self.children[pid] = (slot, time.monotonic())
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)

    def _run_child(self, slot: int) -> None:  # pragma: no cover - runs in the child
        code = 1
        try:
            os.setpgid(0, 0)  # a terminal's Ctrl-C goes to the supervisor, which forwards it once
            for sig in SIGNALS:
                signal.signal(sig, signal.SIG_DFL)  # the worker installs its own
            signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
            code = self.child(slot)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except Exception:  # noqa: BLE001 - a child must end in os._exit, never unwind into the supervisor
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def _reaped(self, pid: int, code: int) -> None:
        slot, started = self.children.pop(pid)
        # A child killed by the forwarded signal before it installed its handlers held nothing.
        clean = code == 0 or (self.stopping and -code in SIGNALS)
        if clean:
            return
        lived = time.monotonic() - started
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"status {code}"
        if self.restart and not self.stopping:
            delay = 0.0 if lived >= YOUNG_SECONDS else self._delays.get(slot, FIRST_RESTART_DELAY)
            self._delays[slot] = 0.0 if lived >= YOUNG_SECONDS else min(MAX_RESTART_DELAY, 2 * max(delay, 0.25))
            self._log(logging.WARNING, "worker process died; restarting it", pid=pid, exit=how, delay=delay)
            self._sleep(delay)
            if not self.stopping:
                self.restarts += 1
                self._spawn(slot)
                return
        self.failed = True
        self._log(logging.ERROR, "worker process failed", pid=pid, exit=how)

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stopping and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.1))

    def _forward(self, signum: int, frame: Any) -> None:
        self.signals += 1
        for pid in list(self.children):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:  # exited, not reaped yet
                pass

    def _log(self, level: int, message: str, **fields: Any) -> None:
        if logger.isEnabledFor(level):
            data = {"supervisor_pid": os.getpid(), "processes": self.processes, **fields}
            logger.log(level, message, extra={"distsched": data})
