"""Paused queues: pause, resume, what is paused, and the queues' depth.

A paused queue's runs are not claimed: both claim paths read the one rule
(``queue_models.not_paused_sql``), through ``RunQuerySet.claimable`` and the
one-statement claim in ``db.claims``. Runs keep arriving (tick, trigger,
enqueue) and wait; runs already claimed (running, or prefetched by a worker)
carry on. A lease that expires in a paused queue is still recovered
(``claiming.claim_runs``): dead when out of attempts, else back to pending,
not claimed again until the resume. A claim that started before the pause
committed may still take a run (the pause is read once per claim statement).

Every change is one transaction that also writes its ``QueueEvent`` (who,
when, why), and both are idempotent:

- pausing a paused queue keeps the first pause (its time, actor and reason)
  and writes nothing: the answer says who paused it, and ``changed`` is False;
  to change the reason, resume and pause again;
- resuming a queue that is not paused writes nothing (``changed`` False).

Each pause and resume that changes something is also an entry of the action log
(``services.audit``), with ``source`` saying where it came from.

Resuming notifies the queue inside its transaction (``db.notify``: delivered
at commit), so idle PostgreSQL workers claim its runs at once instead of at
their next poll.
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Count

from ..db import notify
from ..errors import ValidationError
from ..models import ACTIVE_STATES, AuditAction, AuditSource, AuditTarget, QueueAction, QueueEvent, QueuePause, Run
from . import audit
from .validation import QUEUE_RE, check_storable, validate_queue

MAX_REASON = 1000
MAX_ACTOR = 200


@dataclass(frozen=True, kw_only=True)
class QueueChange:
    """What ``pause_queue`` / ``resume_queue`` did."""

    queue: str
    changed: bool  # False: it already was paused (pause), or was not paused (resume); nothing was written
    # pause_queue: the pause in effect (the first one when it already was paused); resume_queue: the
    # pause lifted, None when there was none.
    pause: QueuePause | None


@dataclass(frozen=True, kw_only=True)
class QueueSummary:
    """One queue in ``list_queues``: its unfinished runs by state, and its pause if paused."""

    queue: str
    runs: dict[str, int] = field(default_factory=dict)  # every unfinished state a key, zeros included
    pause: QueuePause | None = None

    @property
    def paused(self) -> bool:
        return self.pause is not None


def pause_queue(name: Any, *, now: datetime, by: Any, reason: Any = "", source: str = AuditSource.CODE) -> QueueChange:
    """Stop claims of the queue's runs until it is resumed (new runs still arrive and wait)."""
    queue = validate_queue(name)
    actor, why = _actor(by), _reason(reason)
    who = audit.who(actor, source, why)
    with transaction.atomic():
        # The primary key decides: of two concurrent pauses one inserts, the other reads its row.
        pause, created = QueuePause.objects.get_or_create(
            queue=queue, defaults={"paused_at": now, "paused_by": actor, "reason": why}
        )
        if created:
            QueueEvent.objects.create(queue=queue, action=QueueAction.PAUSE, actor=actor, reason=why, created_at=now)
            audit.record(kind=AuditTarget.QUEUE, target=queue, action=AuditAction.PAUSE, now=now, who=who)
    return QueueChange(queue=queue, changed=created, pause=pause)


def resume_queue(name: Any, *, now: datetime, by: Any, source: str = AuditSource.CODE) -> QueueChange:
    """Let workers claim the queue's runs again, and wake the idle ones (PostgreSQL)."""
    queue = _resumable(name)
    actor = _actor(by)
    who = audit.who(actor, source, "")
    with transaction.atomic():
        # Locked: of two concurrent resumes the second waits, then finds no row and writes nothing.
        pause = QueuePause.objects.select_for_update().filter(queue=queue).first()
        if pause is None:
            return QueueChange(queue=queue, changed=False, pause=None)
        QueuePause.objects.filter(queue=queue).delete()
        QueueEvent.objects.create(queue=queue, action=QueueAction.RESUME, actor=actor, reason="", created_at=now)
        audit.record(kind=AuditTarget.QUEUE, target=queue, action=AuditAction.RESUME, now=now, who=who)
        notify.notify([queue])  # delivered at commit, dropped on rollback
    return QueueChange(queue=queue, changed=True, pause=pause)


def paused_queues() -> list[QueuePause]:
    """The paused queues, by name."""
    return list(QueuePause.objects.order_by("queue"))


def paused_names() -> frozenset[str]:
    return frozenset(QueuePause.objects.values_list("queue", flat=True))


def pause_of(queue: str) -> QueuePause | None:
    """The queue's pause, or None when it is not paused."""
    return QueuePause.objects.filter(queue=queue).first()


def queue_events(name: Any, *, limit: int = 50) -> list[QueueEvent]:
    """The queue's pauses and resumes, newest first (also after the queue was resumed)."""
    if not isinstance(name, str) or not QUEUE_RE.fullmatch(name):
        validate_queue(name)  # the typed error for a malformed name
    return list(QueueEvent.objects.filter(queue=name).order_by("-id")[:limit])


def list_queues() -> list[QueueSummary]:
    """Every queue that holds unfinished runs or is paused, by name: its runs by unfinished state
    (pending, retrying, leased, running) and its pause. Two queries; the counts come from the
    ``(state, queue, origin)`` index over unfinished runs only."""

    def zeros() -> dict[str, int]:
        return {state.value: 0 for state in ACTIVE_STATES}

    counts: dict[str, dict[str, int]] = {}
    rows = Run.objects.filter(state__in=ACTIVE_STATES).order_by().values("queue", "state").annotate(n=Count("*"))
    for row in rows:
        counts.setdefault(row["queue"], zeros())[row["state"]] = row["n"]
    pauses = {p.queue: p for p in paused_queues()}
    return [
        QueueSummary(queue=queue, runs=counts.get(queue) or zeros(), pause=pauses.get(queue))
        for queue in sorted(counts.keys() | pauses.keys())
    ]


# ------------------------------------------------------------------ actors


def user_actor(username: str) -> str:
    """The actor of a request (API, admin): ``user:<username>``."""
    return f"user:{username}"


def cli_actor() -> str:
    """The actor of ``manage.py distsched``: ``cli:<os user>`` (the uid where the OS names none)."""
    try:
        name = getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry (some containers)
        name = str(os.getuid())
    return f"cli:{name}"


def _actor(by: Any) -> str:
    if not isinstance(by, str) or not by.strip():
        raise ValidationError("by (who pauses or resumes) must be a non-empty string", field="by")
    if len(by) > MAX_ACTOR:
        raise ValidationError(f"by is longer than {MAX_ACTOR} characters", field="by")
    return check_storable(by, field="by")


def _reason(reason: Any) -> str:
    if reason is None:
        return ""
    if not isinstance(reason, str):
        raise ValidationError("reason must be text", field="reason")
    if len(reason) > MAX_REASON:
        raise ValidationError(f"reason is longer than {MAX_REASON} characters", field="reason")
    return check_storable(reason, field="reason")


def _resumable(name: Any) -> str:
    """``validate_queue``, except that a paused queue can be resumed even after ``DISTSCHED["QUEUES"]``
    dropped it (else it would stay paused until the setting named it again)."""
    try:
        return validate_queue(name)
    except ValidationError:
        if isinstance(name, str) and QUEUE_RE.fullmatch(name) and QueuePause.objects.filter(queue=name).exists():
            return name
        raise
