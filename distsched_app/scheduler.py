"""The public facade: services bound to one clock.

scheduler = Scheduler()                       # system clock
scheduler = Scheduler(clock=FakeClock(...))   # tests
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .clock import Clock, current_clock
from .models import AuditEntry, Run, Schedule
from .services import audit, claiming, queues, runs, schedules, stats, tick
from .services.stats import Stats
from .worker import Worker


class Scheduler:
    """Changes are recorded in the audit trail with ``actor`` (default ``"code"``), source
    ``code`` and an optional ``reason``."""

    def __init__(self, *, clock: Clock | None = None) -> None:
        self.clock = clock or current_clock()

    def now(self) -> datetime:
        return self.clock.now()

    # schedules
    def create_schedule(
        self, *, name: str, task_name: str, actor: str = audit.CODE, reason: str = "", **options: Any
    ) -> Schedule:
        return schedules.create_schedule(
            name=name, task_name=task_name, now=self.now(), actor=actor, reason=reason, **options
        )

    def get_schedule(self, name: str) -> Schedule:
        return schedules.get_schedule(name)

    def list_schedules(self, *, paused: bool | None = None) -> list[Schedule]:
        return schedules.list_schedules(paused=paused)

    def update_schedule(
        self,
        name: str,
        *,
        expected_version: int | None = None,
        actor: str = audit.CODE,
        reason: str = "",
        **changes: Any,
    ) -> Schedule:
        return schedules.update_schedule(
            name, now=self.now(), expected_version=expected_version, actor=actor, reason=reason, **changes
        )

    def delete_schedule(self, name: str, *, actor: str = audit.CODE, reason: str = "") -> int:
        """Delete the schedule, keeping its runs and their history; returns how many runs it kept."""
        return schedules.delete_schedule(name, now=self.now(), actor=actor, reason=reason)

    def pause(self, name: str, *, actor: str = audit.CODE, reason: str = "") -> Schedule:
        return schedules.pause_schedule(name, now=self.now(), actor=actor, reason=reason)

    def resume(self, name: str, *, actor: str = audit.CODE, reason: str = "") -> Schedule:
        return schedules.resume_schedule(name, now=self.now(), actor=actor, reason=reason)

    def history(self, name: str) -> list[AuditEntry]:
        """The schedule's versions and actions, newest first (also once it is deleted)."""
        return list(audit.schedule_history(name))

    def restore(
        self,
        name: str,
        version: int,
        *,
        expected_version: int | None = None,
        actor: str = audit.CODE,
        reason: str = "",
    ) -> Schedule:
        """Bring back version ``version``'s configuration as a new version."""
        return schedules.restore_schedule(
            name, version, now=self.now(), expected_version=expected_version, actor=actor, reason=reason
        )

    def pause_queue(self, name: str, *, by: str = "code", reason: str = "") -> queues.QueueChange:
        """Stop claims of the queue's runs until it is resumed (``services.queues.pause_queue``)."""
        return queues.pause_queue(name, now=self.now(), by=by, reason=reason)

    def resume_queue(self, name: str, *, by: str = "code") -> queues.QueueChange:
        return queues.resume_queue(name, now=self.now(), by=by)

    def trigger(self, name: str, *, actor: str = audit.CODE, reason: str = "") -> Run:
        return schedules.trigger_schedule(name, now=self.now(), actor=actor, reason=reason)

    def upcoming(self, name: str, count: int = 5) -> list[datetime]:
        return schedules.upcoming_fire_times(schedules.get_schedule(name), count)

    # runs
    def tick(self) -> list[Run]:
        """One pass of the tick; returns the runs it created, oldest slot first."""
        created = tick.tick(now=self.now())
        ids = [r.run_id for r in created]
        return list(Run.objects.filter(pk__in=ids).select_related("schedule").order_by("scheduled_for", "id"))

    def claim_next_run(
        self,
        *,
        worker_id: str,
        queues: list[str] | None = None,
        lease_seconds: float = 30,
        capabilities: list[str] | None = None,
    ) -> Run | None:
        return claiming.claim_next_run(
            worker_id=worker_id,
            queues=queues,
            lease_seconds=lease_seconds,
            now=self.now(),
            capabilities=capabilities or (),
        )

    def get_run(self, run_id: int) -> Run:
        return runs.get_run(run_id)

    def cancel_run(self, run_id: int, *, actor: str = audit.CODE, reason: str = "") -> Run:
        return runs.cancel_run(run_id, now=self.now(), actor=actor, reason=reason)

    def requeue_run(self, run_id: int, *, actor: str = audit.CODE, reason: str = "") -> Run:
        return runs.requeue_run(run_id, now=self.now(), actor=actor, reason=reason)

    def stats(self) -> Stats:
        return stats.stats(now=self.now())

    # workers
    def worker(self, **options: Any) -> Worker:
        options.setdefault("clock", self.clock)
        return Worker(**options)
