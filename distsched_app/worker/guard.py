"""What this worker can execute: tasks it has registered, and the warnings when it cannot.

A run of a task this worker has not registered (a rolling deploy's new task, a
framework task of a module not imported yet: ``task_import``) is given back
without using an attempt (``services.unknown_tasks.release_unknown``), and the
worker leaves that task's runs alone from then on: its name joins the claim's
``task_name NOT IN (...)`` (the same clause capabilities use), so an old worker
neither spins on it nor delays it for a worker that has it. The warning is
logged once per task name. Every few minutes the worker also warns when runs
wait in queues that no live worker serves.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from ..registry import TaskEntry
from ..services import unknown_tasks, workers
from ..task_import import import_framework_task
from .execute import describe_exception

if TYPE_CHECKING:
    from . import Worker

# At most this many unknown task names are left alone by the claim (a bound on the clause).
MAX_SKIPPED_TASKS = 100
# How often a worker looks for runs waiting in queues that no live worker serves.
UNSERVED_CHECK_SECONDS = 300.0


class Guard:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self._lock = threading.Lock()
        self._skipped: set[str] = set()
        self._warned: set[str] = set()
        self._next_unserved_check = time.monotonic() + 10.0  # not at start: other workers may be starting too

    def skipped(self) -> list[str]:
        """Task names the claim leaves alone (runs this worker gave back as unknown)."""
        with self._lock:
            return sorted(self._skipped)

    def resolve(self, task_name: str) -> TaskEntry | None:
        """The task's entry, importing a framework task's module when allowed; None if unknown."""
        w = self.worker
        if (entry := w.registry.find(task_name)) is not None:
            return entry
        entry = import_framework_task(task_name, w.registry)
        if entry is not None:
            try:
                workers.publish_tasks(worker_id=w.worker_id, tasks=w.registry.names())
            except Exception as exc:  # noqa: BLE001 - the next start publishes them; explain may lag meanwhile
                w.log(logging.WARNING, "could not publish the worker's tasks", error=describe_exception(exc))
        return entry

    def note_unknown(self, task_name: str, run_id: int) -> None:
        """Leave this task's runs to other workers from now on; warn the first time."""
        with self._lock:
            if len(self._skipped) < MAX_SKIPPED_TASKS:
                self._skipped.add(task_name)
            first = task_name not in self._warned and len(self._warned) < MAX_SKIPPED_TASKS
            if first:
                self._warned.add(task_name)
        if first:
            self.worker.log(
                logging.WARNING,
                "task %s is not registered on this worker: its runs are left to workers that have it "
                "(deploy this worker's new code, or check INSTALLED_APPS)",
                task_name,
                task=task_name,
                run_id=run_id,
            )

    def maybe_warn_unserved(self) -> None:
        """Every UNSERVED_CHECK_SECONDS: warn about queues with due runs and no live worker serving them."""
        if time.monotonic() < self._next_unserved_check:
            return
        self._next_unserved_check = time.monotonic() + UNSERVED_CHECK_SECONDS
        w = self.worker
        try:
            unserved = unknown_tasks.unserved_queues(w.clock.now())
        except Exception as exc:  # noqa: BLE001 - a warning's query must not disturb the claim loop
            w.log(logging.WARNING, "could not look for unserved queues", error=describe_exception(exc))
            return
        if unserved:
            w.log(
                logging.WARNING,
                "runs wait in queues that no live worker serves: %s (start a worker with --queues NAME, or '*')",
                ", ".join(f"{queue} ({n})" for queue, n in unserved.items()),
                queues=",".join(unserved),
            )
