"""The runs a worker holds, from claim until their outcome is recorded, and what it knows of them.

Shared by the loop, the task threads and the heartbeat thread, so every read
and write takes the one lock: which runs are held (and at which attempt: the
fencing token the heartbeat renews), which are executing right now, which had
a cancel requested, which lost their lease.
"""

from __future__ import annotations

import threading

from ..models import Run, RunState
from .execute import Attempt


class Held:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._attempts: dict[int, Attempt] = {}
        self._executing: set[int] = set()
        self._cancelled: set[int] = set()
        self._lost: set[int] = set()
        self.executed = 0  # task calls completed by this worker

    def hold(self, runs: list[Run]) -> list[Attempt]:
        """Take freshly claimed runs in hand (a run claimed as ``running`` has its start recorded)."""
        attempts = [Attempt(run=r, started_recorded=r.state == RunState.RUNNING) for r in runs]
        with self._lock:
            for a in attempts:
                self._attempts[a.run_id] = a
                if a.run.cancel_requested:
                    self._cancelled.add(a.run_id)
        return attempts

    def release(self, run_id: int) -> None:
        """The run's outcome is recorded (or given up on): forget it."""
        with self._lock:
            self._attempts.pop(run_id, None)
            self._cancelled.discard(run_id)
            self._lost.discard(run_id)

    def start(self, run_id: int) -> bool:
        """The task is about to be called; True if a cancel was requested before."""
        with self._lock:
            self._executing.add(run_id)
            return run_id in self._cancelled

    def stop(self, run_id: int) -> None:
        with self._lock:
            self._executing.discard(run_id)
            self.executed += 1

    def leases(self) -> dict[int, int]:
        """Run id -> attempt of every run held: the leases the heartbeat renews."""
        with self._lock:
            return {run_id: a.number for run_id, a in self._attempts.items()}

    def executing(self) -> list[Attempt]:
        with self._lock:
            return [self._attempts[r] for r in self._executing if r in self._attempts]

    def cancel_requested(self, run_id: int) -> bool:
        with self._lock:
            return run_id in self._cancelled

    def cancelled(self) -> set[int]:
        with self._lock:
            return set(self._cancelled)

    def note_cancel_requested(self, run_ids: set[int]) -> None:
        with self._lock:
            self._cancelled |= run_ids

    def note_lost(self, run_ids: set[int]) -> set[int]:
        """Record lost leases; returns those not known to be lost before."""
        with self._lock:
            new = run_ids - self._lost
            self._lost |= run_ids
            return new
