"""Runs a worker cannot execute: tasks it has not registered, queues nobody serves.

During a rolling deploy an old worker may claim a run of a task that only the
new code has. It never spends an attempt on it: ``release_unknown`` gives the
run back in one fenced transaction, its attempt restored, so a worker that has
the task takes it (the old worker then leaves that task's runs alone:
``worker.guard``). Workers publish the task names they have registered on their
row (``Worker.tasks``); from those, ``unknown_task`` tells whether any live worker
can execute a run, for explain, the admin and metrics, and ``unserved_queues``
names queues whose runs wait with no live worker serving them.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Count

from ..db import fencing
from ..models import LEASED_STATES, WAITING_STATES, EventType, QueuePause, Run, RunEvent, Worker
from . import events, handback

REASON = "unknown_task"
# A run released again and again (several old workers, or none has the task) comes back later
# each time: 0 s the first time (a worker that has the task may be waiting), then 1, 2, 4 ... s.
MAX_RELEASE_DELAY_SECONDS = 60.0


def release_delay(previous_releases: int) -> float:
    """Seconds before a run released for an unknown task is claimable again (pure)."""
    if previous_releases <= 0:
        return 0.0
    return min(2.0 ** (previous_releases - 1), MAX_RELEASE_DELAY_SECONDS)


def release_unknown(*, worker_id: str, run_id: int, attempt: int, task_name: str, now: datetime) -> bool:
    """Give back a run whose task ``worker_id`` has not registered, without using an attempt.

    Fenced on the lease owner and attempt (a run whose lease was lost meanwhile is left alone;
    returns False). In one transaction: the attempt is handed back (the next claim issues the
    same fencing token), the lease cleared, the run ``pending`` again from ``release_delay``
    on, its limit slots freed, and a ``released`` event names the worker and the task.
    """
    with transaction.atomic():
        rows = fencing.held_rows(worker_id, [run_id], extra=("state",), lock=True)
        if not rows or rows[0][1] != attempt:
            return False
        before = RunEvent.objects.filter(run_id=run_id, event_type=EventType.RELEASED, data__reason=REASON).count()
        available = now + timedelta(seconds=release_delay(before))
        handback.hand_back(
            [run_id],
            worker_id=worker_id,
            states=LEASED_STATES,
            available_at=available,
            now=now,
            attempt=attempt,
            # No attempt ran: a run never attempted before has not started.
            unstarted=attempt <= 1,
        )
        events.record_many(
            [
                events.NewEvent(
                    run_id=run_id,
                    event_type=EventType.RELEASED,
                    now=now,
                    worker_id=worker_id,
                    attempt=attempt - 1,
                    message=f"task {task_name!r} is not registered on worker {worker_id}: given back "
                    f"without using an attempt, claimable again at {available.isoformat()}",
                    data={"reason": REASON, "task": task_name},
                )
            ]
        )
    return True


LiveWorkers = list[tuple[list[str], "list[str] | None"]]


def live_workers(now: datetime) -> LiveWorkers:
    """(queues, tasks) of every live worker; empty queues serve every queue, tasks None: not published."""
    return list(Worker.objects.alive(now).values_list("queues", "tasks"))


def serves(queues: list[str], queue: str) -> bool:
    """Whether a worker of ``queues`` serves ``queue`` (no queues: every queue)."""
    return not queues or queue in queues


def unknown_task(task_name: str, queue: str, *, live: LiveWorkers) -> bool:
    """True when live workers serve ``queue``, every one of them has published its tasks, and none
    has ``task_name`` registered: no live worker can execute the run."""
    serving = [tasks for queues, tasks in live if serves(queues, queue)]
    return bool(serving) and all(tasks is not None and task_name not in tasks for tasks in serving)


def runs_with_unknown_task(now: datetime, *, live: LiveWorkers | None = None) -> int:
    """Waiting runs (pending, retrying) whose task no live worker serving their queue has registered.
    One query (two without ``live``); none when no live worker, or one that did not publish its tasks, is up."""
    live = live_workers(now) if live is None else live
    if not live or any(tasks is None for _, tasks in live):
        return 0
    known = sorted({name for _, tasks in live for name in tasks or ()})
    rows = (
        Run.objects.filter(state__in=list(WAITING_STATES))
        .exclude(task_name__in=known)
        .order_by()
        .values_list("task_name", "queue")
        .annotate(n=Count("id"))
    )
    # A run whose queue no live worker serves is the unserved-queue warning's, not this count's.
    return sum(n for _, queue, n in rows if any(serves(queues, queue) for queues, _ in live))


def unserved_queues(now: datetime) -> dict[str, int]:
    """Queue -> due waiting runs, for the queues that no live worker serves and nobody paused
    (a paused queue's runs wait on purpose). Two queries (the claim's partial index, the workers)."""
    waiting = dict(
        Run.objects.waiting(now).order_by().values("queue").annotate(n=Count("id")).values_list("queue", "n")
    )
    if not waiting:
        return {}
    live = [queues for queues, _ in live_workers(now)]
    paused = set(QueuePause.objects.filter(queue__in=list(waiting)).values_list("queue", flat=True))
    return {
        queue: n
        for queue, n in sorted(waiting.items())
        if queue not in paused and not any(serves(queues, queue) for queues in live)
    }
