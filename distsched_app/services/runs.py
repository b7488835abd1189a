"""Operator actions on runs: read, cancel, requeue."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from ..errors import InvalidStateTransition, RunNotFound
from ..models import EventType, Run, RunState
from . import events

CANCELLABLE_AT_ONCE = (RunState.PENDING, RunState.RETRYING)
CANCELLABLE_COOPERATIVELY = (RunState.LEASED, RunState.RUNNING)
REQUEUEABLE = (RunState.DEAD, RunState.CANCELLED)


def get_run(run_id: int) -> Run:
    try:
        return Run.objects.select_related("schedule").get(pk=run_id)
    except (Run.DoesNotExist, ValueError, TypeError):
        raise RunNotFound(f"no run with id {run_id!r}") from None


def cancel_requested(run_id: int) -> bool:
    """Whether an operator asked to stop this run (the running task's cooperative-cancel probe)."""
    return bool(Run.objects.filter(pk=run_id).values_list("cancel_requested", flat=True).first())


def _locked(run_id: int) -> Run:
    try:
        return Run.objects.select_for_update(of=("self",)).select_related("schedule").get(pk=run_id)
    except (Run.DoesNotExist, ValueError, TypeError):
        raise RunNotFound(f"no run with id {run_id!r}") from None


def cancel_run(run_id: int, *, now: datetime, by: str = "") -> Run:
    """Pending/retrying runs end ``cancelled`` at once; a running run is asked to
    stop (``cancel_requested``) and its task sees ``context.cancel_requested()``.
    The worker never kills a running function."""
    with transaction.atomic():
        run = _locked(run_id)
        if run.state in CANCELLABLE_AT_ONCE:
            run.state = RunState.CANCELLED
            run.finished_at = now
            run.updated_at = now
            run.save(update_fields=["state", "finished_at", "updated_at"])
            events.record(run, EventType.CANCELLED, now=now, message=f"cancelled by {by or 'operator'}")
        elif run.state in CANCELLABLE_COOPERATIVELY:
            if not run.cancel_requested:
                run.cancel_requested = True
                run.updated_at = now
                run.save(update_fields=["cancel_requested", "updated_at"])
                events.record(
                    run, EventType.CANCEL_REQUESTED, now=now, message=f"cancel requested by {by or 'operator'}"
                )
        else:
            raise InvalidStateTransition(
                f"run {run.pk} is {run.state}; only pending, retrying, leased or running runs can be cancelled"
            )
    return run


def requeue_run(run_id: int, *, now: datetime, by: str = "") -> Run:
    """Put a dead or cancelled run back to ``pending`` now with a fresh attempt
    budget. ``attempts`` is kept, so the fencing token only ever grows."""
    with transaction.atomic():
        run = _locked(run_id)
        if run.state not in REQUEUEABLE:
            raise InvalidStateTransition(f"run {run.pk} is {run.state}; only dead or cancelled runs can be requeued")
        run.state = RunState.PENDING
        run.available_at = now
        run.max_attempts = run.attempts + run.schedule.max_attempts
        run.cancel_requested = False
        run.finished_at = None
        run.lease_owner = ""
        run.lease_expires_at = None
        run.updated_at = now
        run.save(
            update_fields=[
                "state",
                "available_at",
                "max_attempts",
                "cancel_requested",
                "finished_at",
                "lease_owner",
                "lease_expires_at",
                "updated_at",
            ]
        )
        events.record(
            run,
            EventType.REQUEUED,
            now=now,
            message=f"requeued by {by or 'operator'}; up to {run.max_attempts - run.attempts} more attempt(s)",
        )
    return run
