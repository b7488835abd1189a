"""The public facade: services bound to one clock.

scheduler = Scheduler()                       # system clock
scheduler = Scheduler(clock=FakeClock(...))   # tests
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .clock import Clock, current_clock
from .models import Run, Schedule
from .services import claiming, queues, runs, schedules, stats, tick
from .services.stats import Stats
from .worker import Worker


class Scheduler:
    def __init__(self, *, clock: Clock | None = None) -> None:
        self.clock = clock or current_clock()

    def now(self) -> datetime:
        return self.clock.now()

    # schedules
    def create_schedule(self, *, name: str, task_name: str, **options: Any) -> Schedule:
        return schedules.create_schedule(name=name, task_name=task_name, now=self.now(), **options)

    def get_schedule(self, name: str) -> Schedule:
        return schedules.get_schedule(name)

    def list_schedules(self, *, paused: bool | None = None) -> list[Schedule]:
        return schedules.list_schedules(paused=paused)

    def update_schedule(self, name: str, **changes: Any) -> Schedule:
        return schedules.update_schedule(name, now=self.now(), **changes)

    def delete_schedule(self, name: str) -> None:
        schedules.delete_schedule(name)

    def pause(self, name: str) -> Schedule:
        return schedules.pause_schedule(name, now=self.now())

    def resume(self, name: str) -> Schedule:
        return schedules.resume_schedule(name, now=self.now())

    def pause_queue(self, name: str, *, by: str = "code", reason: str = "") -> queues.QueueChange:
        """Stop claims of the queue's runs until it is resumed (``services.queues.pause_queue``)."""
        return queues.pause_queue(name, now=self.now(), by=by, reason=reason)

    def resume_queue(self, name: str, *, by: str = "code") -> queues.QueueChange:
        return queues.resume_queue(name, now=self.now(), by=by)

    def trigger(self, name: str) -> Run:
        return schedules.trigger_schedule(name, now=self.now())

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

    def cancel_run(self, run_id: int) -> Run:
        return runs.cancel_run(run_id, now=self.now())

    def requeue_run(self, run_id: int) -> Run:
        return runs.requeue_run(run_id, now=self.now())

    def stats(self) -> Stats:
        return stats.stats(now=self.now())

    # workers
    def worker(self, **options: Any) -> Worker:
        options.setdefault("clock", self.clock)
        return Worker(**options)
