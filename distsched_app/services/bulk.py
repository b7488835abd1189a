"""Bulk actions: requeue or cancel every run matching a filter, as a durable job in batches.

A request (API, admin, CLI) only creates the job (``create_bulk_action``: the filter checked,
the runs counted, one audit entry with the filter and the count, in one short transaction) or
counts (``preview``, a dry run). The work happens in ``process_bulk_actions``, which workers call
from their loop and ``distsched run requeue|cancel --state ...`` runs in the foreground.

Which runs: those matching the filter, in a state the action applies to (requeue: dead or
cancelled; cancel: pending, retrying, blocked, leased, running), with an id up to the highest run
id when the job was created (``max_run_id``): a run created later is never touched, whatever it
matches. Each batch takes the next matching ids after ``cursor`` in id order, re-checks them under
their row locks, acts through ``services.runs`` (``requeue_many``, ``cancel_many``: each run's own
history records it) and moves the cursor, all in one transaction: a crash loses at most the batch
in flight, which rolls back whole, and whoever goes on starts after the cursor, so no run is done
twice or skipped.

One processor at a time: a processor takes a job by a conditional UPDATE of its lease (free or
expired), and each batch first renews the lease on the condition that it still holds it (the
batch's fence). The job row stays locked until the batch commits, so nobody can take the job
mid-batch; a processor that died leaves a lease that runs out after ``LEASE_SECONDS``, and the
next one continues. An operator may stop a job (``stop_bulk_action``): its next batch finds it
no longer running and writes nothing.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Count, F, Max, Min, Q, QuerySet

from ..clock import Clock
from ..db import locks
from ..db.retry import is_transient
from ..errors import BulkActionNotFound, InvalidStateTransition, ValidationError
from ..models import (
    UNFINISHED_BULK_STATES,
    AuditAction,
    AuditSource,
    AuditTarget,
    BulkAction,
    BulkKind,
    BulkState,
    Run,
)
from ..text import storable
from . import audit, run_filters, runs

logger = logging.getLogger("distsched.bulk")

BATCH_SIZE = 1000
MAX_BATCH_SIZE = 10_000
# At most this many ids are scanned per batch: a filter that matches sparsely (an unindexed
# task name) still makes short transactions, each moving the cursor this far at least.
ID_WINDOW = 100_000
LEASE_SECONDS = 30.0
ELIGIBLE = {
    BulkKind.REQUEUE: runs.REQUEUEABLE,
    BulkKind.CANCEL: runs.CANCELLABLE_AT_ONCE + runs.CANCELLABLE_COOPERATIVELY,
}
ACTS = {BulkKind.REQUEUE: runs.requeue_many, BulkKind.CANCEL: runs.cancel_many}
PAST = {BulkKind.REQUEUE: "requeued", BulkKind.CANCEL: "cancelled"}  # how messages say what a job did


class LeaseLost(Exception):
    """Another processor took the job (this one's lease had run out): the batch rolled back."""


@dataclass(frozen=True, kw_only=True)
class Preview:
    """A dry run: how many runs the action would act on now."""

    action: str
    filter: dict[str, Any]
    count: int


@dataclass(frozen=True, kw_only=True)
class Processed:
    """What one ``process_bulk_actions`` call did: batches committed, and whether a job it worked
    on is unfinished still (its time was up)."""

    batches: int = 0
    more: bool = False


# ------------------------------------------------------------------ which runs


def _action(action: Any) -> str:
    if action not in BulkKind.values:
        raise ValidationError(f"action must be one of {', '.join(BulkKind.values)}", field="action")
    return str(action)


def states_for(action: str, cleaned: dict[str, Any]) -> list[str]:
    """The states the job acts on: the filter's, among those the action applies to. A filter that
    names only other states is refused (it could never act on anything)."""
    eligible = [str(s) for s in ELIGIBLE[BulkKind(action)]]
    named = run_filters.states_of(cleaned)
    if named is None:
        return eligible
    states = [s for s in eligible if s in named]
    if not states:
        raise ValidationError(
            f"{action} applies to {', '.join(eligible)} runs only; state {', '.join(named)} matches none of them",
            field="filter.state",
        )
    return states


def matching(action: str, cleaned: dict[str, Any]) -> QuerySet[Run]:
    """The runs the action would act on now (the filter, in a state the action applies to)."""
    return Run.objects.filter(run_filters.to_q(cleaned), state__in=states_for(action, cleaned)).order_by()


def _max_run_id() -> int:
    return Run.objects.aggregate(top=Max("pk"))["top"] or 0


def preview(*, action: Any, filter: Any) -> Preview:
    """A dry run: the count, and nothing written."""
    action = _action(action)
    cleaned = run_filters.clean(filter)
    return Preview(action=action, filter=cleaned, count=matching(action, cleaned).count())


def create_bulk_action(
    *, action: Any, filter: Any, now: datetime, actor: str = audit.CODE, source: str = AuditSource.CODE,
    reason: str = "",
) -> BulkAction:  # fmt: skip
    """A new job for the matching runs (none: a job already done), and its one audit entry, with the
    filter as applied and the count, in the same transaction. Nothing is acted on here."""
    who = audit.who(actor, source, reason)
    action = _action(action)
    cleaned = run_filters.clean(filter)
    # Read before the (short) writing transaction: on SQLite it holds the database's write lock.
    top = _max_run_id()
    # The count and the first matching id in one read: the cursor starts just before it.
    found = matching(action, cleaned).filter(pk__lte=top).aggregate(n=Count("pk"), first=Min("pk"))
    matched, first = found["n"], found["first"] or 1
    state = BulkState.PENDING if matched else BulkState.DONE
    with transaction.atomic():
        job = BulkAction.objects.create(
            action=action, filter=cleaned, actor=who[0], source=who[1], reason=who[2], state=state, max_run_id=top,
            cursor=first - 1, matched=matched, created_at=now, updated_at=now, finished_at=None if matched else now,
        )  # fmt: skip
        audit.record(
            kind=AuditTarget.BULK, target=str(job.pk), action=action, now=now, who=who,
            data={"filter": cleaned, "matched": matched, "max_run_id": top},
        )  # fmt: skip
    return job


def stop_bulk_action(
    pk: Any, *, now: datetime, actor: str = audit.CODE, source: str = AuditSource.CODE, reason: str = ""
) -> BulkAction:
    """Stop an unfinished job (state ``cancelled``): the batches done stay done, no other starts.
    Waits for a batch in flight (its row lock); audited. ``InvalidStateTransition`` once finished."""
    who = audit.who(actor, source, reason)
    job = get_bulk_action(pk)
    with transaction.atomic():
        job = locks.row_locked(BulkAction.objects.filter(pk=job.pk)).get()
        if job.state not in UNFINISHED_BULK_STATES:
            raise InvalidStateTransition(
                f"bulk action {job.pk} is {job.state}; only a pending or running one can be stopped"
            )
        BulkAction.objects.filter(pk=job.pk).update(
            state=BulkState.CANCELLED, finished_at=now, lease_owner="", lease_expires_at=None, updated_at=now
        )
        audit.record(
            kind=AuditTarget.BULK, target=str(job.pk), action=AuditAction.STOP, now=now, who=who,
            data={"done": job.done, "skipped": job.skipped, "matched": job.matched},
        )  # fmt: skip
    job.refresh_from_db()
    return job


def get_bulk_action(pk: Any) -> BulkAction:
    """The job of id ``pk`` (an int, or its digits as text); ``BulkActionNotFound`` otherwise."""
    text = str(pk) if isinstance(pk, int) and not isinstance(pk, bool) else pk
    if not (isinstance(text, str) and text.isascii() and text.isdigit() and 0 < int(text[:20]) < 2**63):
        raise BulkActionNotFound(f"no bulk action with id {pk!r}")
    try:
        return BulkAction.objects.get(pk=int(text))
    except BulkAction.DoesNotExist:
        raise BulkActionNotFound(f"no bulk action with id {pk!r}") from None


def list_bulk_actions() -> QuerySet[BulkAction]:
    return BulkAction.objects.order_by("-id")


def unfinished() -> QuerySet[BulkAction]:
    return BulkAction.objects.filter(state__in=UNFINISHED_BULK_STATES).order_by("pk")


def _message(job: BulkAction) -> str:
    """How each run's history names the job ("requeued by alice (bulk action 7): why")."""
    text = f"by {job.actor} (bulk action {job.pk})"
    return f"{text}: {job.reason}" if job.reason else text


# ------------------------------------------------------------------ processing


def default_owner() -> str:
    """Who processes: host, pid and a random part, unique to this processor."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _free(now: datetime) -> Q:
    return Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lte=now)


def free_to_take(now: datetime) -> QuerySet[BulkAction]:
    """Unfinished jobs whose lease is free or has run out at ``now``: what ``acquire`` takes."""
    return unfinished().filter(_free(now))


def acquire(owner: str, now: datetime, *, job_id: int | None = None) -> BulkAction | None:
    """Take the oldest unfinished job whose lease is free or has run out (or job ``job_id``):
    a conditional UPDATE, so of two processors asking at once exactly one gets it."""
    candidates = free_to_take(now)
    if job_id is not None:
        candidates = candidates.filter(pk=job_id)
    for pk in candidates.values_list("pk", flat=True)[:10]:
        with transaction.atomic():
            took = (
                BulkAction.objects.filter(pk=pk, state__in=UNFINISHED_BULK_STATES)
                .filter(_free(now))
                .update(
                    lease_owner=owner,
                    lease_expires_at=now + timedelta(seconds=LEASE_SECONDS),
                    state=BulkState.RUNNING,
                    updated_at=now,
                )
            )
            if took:
                BulkAction.objects.filter(pk=pk, started_at__isnull=True).update(started_at=now)
                return BulkAction.objects.get(pk=pk)
    return None


def release(job_id: int, owner: str, now: datetime) -> None:
    """Give the lease up (the job stays unfinished): the next processor need not wait for it to expire."""
    BulkAction.objects.filter(pk=job_id, lease_owner=owner).update(
        lease_owner="", lease_expires_at=None, updated_at=now
    )


def process_batch(job_id: int, owner: str, now: datetime, *, batch_size: int = BATCH_SIZE) -> BulkAction:
    """One batch of the job, in one transaction: renew the lease (``LeaseLost`` if another holds
    it), act on the next matching runs after the cursor, move the cursor. Returns the job after it."""
    with transaction.atomic():
        renewed = BulkAction.objects.filter(pk=job_id, lease_owner=owner, state=BulkState.RUNNING).update(
            lease_expires_at=now + timedelta(seconds=LEASE_SECONDS), updated_at=now
        )  # first: the job's row stays locked until this batch commits
        if not renewed:
            raise LeaseLost(f"bulk action {job_id} is no longer leased to {owner}")
        job = BulkAction.objects.get(pk=job_id)
        cleaned = job.filter
        upper = min(job.max_run_id, job.cursor + ID_WINDOW)
        window = matching(job.action, cleaned).filter(pk__gt=job.cursor, pk__lte=upper)
        ids = list(window.order_by("pk").values_list("pk", flat=True)[:batch_size])
        outcome = runs.BatchOutcome(done=0, skipped=0)
        if ids:
            outcome = ACTS[BulkKind(job.action)](
                ids, now=now, reason=_message(job), states=states_for(job.action, cleaned)
            )
        cursor = ids[-1] if len(ids) == batch_size else upper
        finished = cursor >= job.max_run_id
        changes: dict[str, Any] = {
            "cursor": cursor, "done": F("done") + outcome.done, "skipped": F("skipped") + outcome.skipped,
            "batches": F("batches") + 1, "updated_at": now,
        }  # fmt: skip
        if finished:
            changes |= {"state": BulkState.DONE, "finished_at": now, "lease_owner": "", "lease_expires_at": None}
        BulkAction.objects.filter(pk=job_id).update(**changes)
    job.refresh_from_db()
    return job


def _fail(job_id: int, owner: str, now: datetime, exc: Exception) -> None:
    with transaction.atomic():
        BulkAction.objects.filter(pk=job_id, lease_owner=owner).update(
            state=BulkState.FAILED, error=storable(f"{type(exc).__name__}: {exc}", 2000), finished_at=now,
            lease_owner="", lease_expires_at=None, updated_at=now,
        )  # fmt: skip


def process_bulk_actions(
    clock: Clock,
    *,
    owner: str | None = None,
    job_id: int | None = None,
    budget_seconds: float | None = None,
    batch_size: int = BATCH_SIZE,
    progress: Callable[[BulkAction], None] | None = None,
) -> Processed:
    """Work on unfinished jobs (or only ``job_id``), batch after batch, until none is left or
    ``budget_seconds`` (of real time) are spent, checked after each batch (so each call moves a job
    it takes on by one batch at least); the clock is read once per batch.

    ``progress`` is called with the job after each committed batch. Ctrl-C (``KeyboardInterrupt``)
    gives the lease up and propagates: the job stays resumable. A batch that fails for a reason other
    than a transient database error marks its job failed (``error``); a transient one propagates
    and the lease runs out, so the next processor retries that batch.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise ValidationError(f"batch_size must be between 1 and {MAX_BATCH_SIZE}", field="batch_size")
    owner = owner or default_owner()
    deadline = None if budget_seconds is None else time.monotonic() + budget_seconds
    batches = 0
    while True:
        job = acquire(owner, clock.now(), job_id=job_id)
        if job is None:
            return Processed(batches=batches)
        try:
            while job.state == BulkState.RUNNING:
                job = process_batch(job.pk, owner, clock.now(), batch_size=batch_size)
                batches += 1
                if progress is not None:
                    progress(job)
                if job.state == BulkState.RUNNING and deadline is not None and time.monotonic() >= deadline:
                    release(job.pk, owner, clock.now())
                    return Processed(batches=batches, more=True)
        except KeyboardInterrupt:
            release(job.pk, owner, clock.now())
            raise
        except LeaseLost:
            continue
        except Exception as exc:
            if is_transient(exc):
                raise
            logger.exception("bulk action %s failed", job.pk)
            _fail(job.pk, owner, clock.now(), exc)
        if job_id is not None:
            return Processed(batches=batches)
        if deadline is not None and time.monotonic() >= deadline:
            return Processed(batches=batches, more=True)  # perhaps another job waits: look again soon
