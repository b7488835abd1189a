"""Operator actions on runs: read, cancel, requeue. Each cancel and requeue is recorded in the
action log (``services.audit``) in its transaction: who, from where, why."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime

from django.db import IntegrityError, transaction
from django.db.models import Case, F, IntegerField, Value, When

from ..db import locks, notify
from ..errors import InvalidStateTransition, RunNotFound, UniqueKeyTaken
from ..models import ACTIVE_STATES, AuditAction, AuditSource, AuditTarget, EventType, Run, RunEvent, RunState
from . import audit, events, workflow_release
from .outcomes import retry_policy_of

CANCELLABLE_AT_ONCE = (RunState.PENDING, RunState.RETRYING, RunState.BLOCKED)
CANCELLABLE_COOPERATIVELY = (RunState.LEASED, RunState.RUNNING)
REQUEUEABLE = (RunState.DEAD, RunState.CANCELLED)

# Lock order of a batch of runs (PostgreSQL): the runs workers may hold first, the waiting
# (``blocked``) ones last, in id order within each. A worker recording a batch locks the runs it
# holds, then the waiting workflow nodes downstream of them (``services.workflow_release``); a
# batch that locked a waiting node before a run a worker holds could wait for that worker while
# the worker waits for the node: a deadlock (``tests/concurrency/test_workflow_cancel_race.py``).
WAITING_LAST = Case(When(state=RunState.BLOCKED, then=Value(1)), default=Value(0), output_field=IntegerField())


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


def _by(who: tuple[str, str, str]) -> str:
    """How the run's history names the operator: "by <actor>", and why when they said."""
    actor, _, reason = who
    return f"by {actor}: {reason}" if reason else f"by {actor}"


def _audited(run: Run, action: str, *, now: datetime, who: tuple[str, str, str]) -> None:
    audit.record(
        kind=AuditTarget.RUN, target=str(run.pk), action=action, now=now, who=who,
        schedule_id=run.schedule_id, data={"state": run.state, "task": run.task_name},
    )  # fmt: skip


def cancel_run(
    run_id: int, *, now: datetime, actor: str = audit.CODE, source: str = AuditSource.CODE, reason: str = ""
) -> Run:
    """Pending, retrying and blocked runs end ``cancelled`` at once; a running run is asked to
    stop (``cancel_requested``) and its task sees ``context.cancel_requested()``.
    The worker never kills a running function. A second cancel of a running run changes
    nothing and is not recorded again."""
    who = audit.who(actor, source, reason)
    with transaction.atomic():
        run = _locked(run_id)
        if run.state not in CANCELLABLE_AT_ONCE + CANCELLABLE_COOPERATIVELY:
            raise InvalidStateTransition(
                f"run {run.pk} is {run.state}; only pending, retrying, blocked, leased or running runs can be cancelled"
            )
        if cancel_locked(run, now=now, reason=_by(who)):
            _audited(run, AuditAction.CANCEL, now=now, who=who)
    return run


def cancel_locked(run: Run, *, now: datetime, reason: str) -> bool:
    """Cancel ``run``, which the caller has locked in its transaction and found cancellable:
    at once when it waits (its ``held_by`` cleared), else by a cancel request its task sees.
    ``reason`` ends the event's message ("cancelled <reason>"). Returns whether anything was
    written (a second request of a running run's cancel writes nothing). The one cancel rule:
    operators (``cancel_run``) and overlap=replace (``services.replacement``) both call it."""
    if run.state in CANCELLABLE_AT_ONCE:
        run.state = RunState.CANCELLED
        run.finished_at = now
        run.held_by = ""
        run.updated_at = now
        run.save(update_fields=["state", "finished_at", "held_by", "updated_at"])
        events.record(run, EventType.CANCELLED, now=now, message=f"cancelled {reason}")
        if run.workflow_id is not None:
            workflow_release.ended({run.pk: RunState.CANCELLED.value}, now=now, workflow_ids=[run.workflow_id])
        return True
    if run.state in CANCELLABLE_COOPERATIVELY and not run.cancel_requested:
        run.cancel_requested = True
        run.updated_at = now
        run.save(update_fields=["cancel_requested", "updated_at"])
        events.record(run, EventType.CANCEL_REQUESTED, now=now, message=f"cancel requested {reason}")
        return True
    return False


def _key_holder(run: Run) -> int | None:
    """The id of another unfinished run of ``run``'s task holding its unique key, if any."""
    if not run.unique_key:
        return None
    others = Run.objects.filter(task_name=run.task_name, unique_key=run.unique_key, state__in=ACTIVE_STATES)
    return others.exclude(pk=run.pk).values_list("pk", flat=True).first()


def _key_taken(run: Run, holder: int | None) -> UniqueKeyTaken:
    by = f"unfinished run {holder}" if holder is not None else "an unfinished run"
    return UniqueKeyTaken(
        f"run {run.pk} cannot be requeued: {by} of task {run.task_name} holds its unique key {run.unique_key!r}"
    )


def requeue_run(
    run_id: int, *, now: datetime, actor: str = audit.CODE, source: str = AuditSource.CODE, reason: str = ""
) -> Run:
    """Put a dead or cancelled run back to ``pending`` now with a fresh attempt
    budget. ``attempts`` is kept, so the fencing token only ever grows.

    A run whose unique key another unfinished run of its task holds now (enqueued
    since this one finished) is refused with ``UniqueKeyTaken``: at most one
    unfinished run per task and key."""
    who = audit.who(actor, source, reason)
    with transaction.atomic():
        run = _locked(run_id)
        if run.state not in REQUEUEABLE:
            raise InvalidStateTransition(f"run {run.pk} is {run.state}; only dead or cancelled runs can be requeued")
        requeue_locked(run, now=now, reason=_by(who))
        _audited(run, AuditAction.REQUEUE, now=now, who=who)
    return run


def requeue_locked(run: Run, *, now: datetime, reason: str) -> None:
    """Requeue ``run``, which the caller has locked in its transaction and found requeueable
    (``reason`` ends the event's message: "requeued <reason>"). ``UniqueKeyTaken`` when another
    unfinished run of its task holds its unique key; the caller's transaction stays usable."""
    if (holder := _key_holder(run)) is not None:
        raise _key_taken(run, holder)
    run.state = RunState.PENDING
    run.available_at = now
    run.max_attempts = run.attempts + retry_policy_of(run).max_attempts
    run.cancel_requested = False
    run.finished_at = None
    run.lease_owner = ""
    run.lease_expires_at = None
    run.updated_at = now
    try:
        # A savepoint: the race this closes is an enqueue of the same task and key committed
        # after the check above (on PostgreSQL our UPDATE waits for it, then violates
        # distsched_run_unique_active_key). The database decides; the transaction stays usable
        # to name the holder, and the refusal rolls the whole requeue back.
        with transaction.atomic():
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
    except IntegrityError:
        if not run.unique_key:
            raise  # not the key: nothing else in this UPDATE can conflict, so it is a real fault
        raise _key_taken(run, _key_holder(run)) from None
    if run.workflow_id is not None:  # waits again behind unfinished upstreams; re-opens what it ended
        workflow_release.requeued(run, now=now)
    notify.notify([run.queue])  # claimable now: wake an idle worker
    events.record(
        run,
        EventType.REQUEUED,
        now=now,
        message=f"requeued {reason}; up to {run.max_attempts - run.attempts} more attempt(s)",
    )


# ------------------------------------------------------------------ many runs at once (bulk actions)


@dataclass(frozen=True, kw_only=True)
class BatchOutcome:
    """What a batch did: ``done`` runs changed; ``skipped`` ones given but left as they were (no
    longer in an allowed state, already asked to stop, or their unique key held by another run)."""

    done: int
    skipped: int


# What a requeue reads of a run (``retry_policy_of``, the unique key's rule, the notification).
REQUEUE_READS = (
    *("id", "state", "attempts", "task_name", "unique_key", "retry_policy", "queue", "schedule_id", "workflow_id"),
    *(
        "schedule__max_attempts",
        "schedule__retry_base_seconds",
        "schedule__retry_max_seconds",
        "schedule__retry_jitter",
    ),
)


def _allowed(states: Iterable[str] | None, eligible: Iterable[str]) -> list[str]:
    eligible = list(eligible)
    return eligible if states is None else [s for s in eligible if s in set(states)]


def requeue_many(ids: list[int], *, now: datetime, reason: str, states: Iterable[str] | None = None) -> BatchOutcome:
    """Requeue the runs of ``ids`` that are (still) requeueable and in ``states``, in the caller's
    transaction: locked by one SELECT, written by one UPDATE per attempt budget, their events by one
    INSERT. A run with a unique key (the key rule) or of a workflow (its upstreams and the nodes it
    ended) goes through ``requeue_locked``, one by one."""
    allowed = _allowed(states, REQUEUEABLE)
    qs = Run.objects.filter(pk__in=ids, state__in=allowed).select_related("schedule").order_by("pk")
    qs = qs.only(*REQUEUE_READS)  # not the payloads, results, errors: a batch reads 1,000 rows
    runs = list(locks.row_locked(qs, of=("self",)))
    one_by_one = [run for run in runs if run.unique_key or run.workflow_id is not None]
    budgets: dict[int, list[Run]] = {}
    for run in runs:
        if not run.unique_key and run.workflow_id is None:
            budgets.setdefault(retry_policy_of(run).max_attempts, []).append(run)
    new_events: list[events.NewEvent] = []
    for budget, group in budgets.items():
        Run.objects.filter(pk__in=[run.pk for run in group]).update(
            state=RunState.PENDING, available_at=now, max_attempts=F("attempts") + budget, cancel_requested=False,
            finished_at=None, lease_owner="", lease_expires_at=None, updated_at=now,
        )  # fmt: skip
        message = f"requeued {reason}; up to {budget} more attempt(s)"
        new_events += [
            events.NewEvent(
                run_id=run.pk, event_type=EventType.REQUEUED, now=now, message=message, attempt=run.attempts
            )
            for run in group
        ]
    events.record_many(new_events)
    done = len(new_events)
    for run in one_by_one:
        try:
            with transaction.atomic():  # a refusal (key held, failed upstream) undoes this run only
                requeue_locked(run, now=now, reason=reason)
            done += 1
        except (UniqueKeyTaken, InvalidStateTransition):
            pass
    if budgets:
        notify.notify(sorted({run.queue for group in budgets.values() for run in group}))
    return BatchOutcome(done=done, skipped=len(ids) - done)


def cancel_many(ids: list[int], *, now: datetime, reason: str, states: Iterable[str] | None = None) -> BatchOutcome:
    """``cancel_locked`` for the runs of ``ids`` still cancellable and in ``states``, in the caller's
    transaction: one locking SELECT, one UPDATE for the waiting runs (cancelled at once), one for the
    running ones (asked to stop), one INSERT of their events."""
    allowed = _allowed(states, CANCELLABLE_AT_ONCE + CANCELLABLE_COOPERATIVELY)
    qs = Run.objects.filter(pk__in=ids, state__in=allowed).order_by(WAITING_LAST, "pk")
    rows = list(locks.row_locked(qs).values_list("pk", "state", "cancel_requested", "attempts", "workflow_id"))
    at_once = [(pk, attempts) for pk, state, _, attempts, _ in rows if state in CANCELLABLE_AT_ONCE]
    asked = [
        (pk, attempts)
        for pk, state, requested, attempts, _ in rows
        if state in CANCELLABLE_COOPERATIVELY and not requested
    ]
    in_workflows = {pk: wf for pk, state, _, _, wf in rows if state in CANCELLABLE_AT_ONCE and wf is not None}
    Run.objects.filter(pk__in=[pk for pk, _ in at_once]).update(
        state=RunState.CANCELLED, finished_at=now, held_by="", updated_at=now
    )
    Run.objects.filter(pk__in=[pk for pk, _ in asked]).update(cancel_requested=True, updated_at=now)
    events.record_many(
        [
            *(
                events.NewEvent(
                    run_id=pk, event_type=EventType.CANCELLED, now=now, message=f"cancelled {reason}", attempt=a
                )
                for pk, a in at_once
            ),
            *(
                events.NewEvent(
                    run_id=pk,
                    event_type=EventType.CANCEL_REQUESTED,
                    now=now,
                    message=f"cancel requested {reason}",
                    attempt=a,
                )
                for pk, a in asked
            ),
        ]
    )
    if in_workflows:  # as cancel_locked: their downstream nodes end or wait on, in this transaction
        workflow_release.ended(
            dict.fromkeys(in_workflows, RunState.CANCELLED.value), now=now, workflow_ids=set(in_workflows.values())
        )
    return BatchOutcome(done=len(at_once) + len(asked), skipped=len(ids) - len(at_once) - len(asked))


@dataclass(frozen=True, kw_only=True)
class AttemptHistory:
    """A run's attempts as its history tells them (what django.tasks reports of a result)."""

    worker_ids: tuple[str, ...] = ()  # one per attempt, in order
    first_started_at: datetime | None = None
    last_started_at: datetime | None = None
    errors: tuple[tuple[str, str], ...] = ()  # (exception class path, traceback) per failed attempt

    @classmethod
    def empty(cls) -> AttemptHistory:
        return cls()

    def with_attempt(self, worker_id: str, started_at: datetime) -> AttemptHistory:
        return replace(
            self,
            worker_ids=(*self.worker_ids, worker_id),
            last_started_at=started_at,
            first_started_at=self.first_started_at or started_at,
        )

    def with_error(self, exception_class_path: str, traceback: str) -> AttemptHistory:
        return replace(self, errors=(*self.errors, (exception_class_path, traceback)))


ATTEMPT_EVENTS = (EventType.CLAIMED, EventType.RELEASED, EventType.STARTED, EventType.FAILED)


def attempt_history(run_id: int, *, before_attempt: int | None = None) -> AttemptHistory:
    """The attempts of a run (those numbered below ``before_attempt``, if given), in one query.

    A claim gives an attempt its worker; a ``released`` event hands an unstarted
    attempt back (the next claim reuses its number).
    """
    qs = RunEvent.objects.filter(run_id=run_id, event_type__in=ATTEMPT_EVENTS)
    if before_attempt is not None:
        qs = qs.filter(attempt__lt=before_attempt)
    workers: dict[int, str] = {}
    first = last = None
    errors: list[tuple[str, str]] = []
    for kind, attempt, worker_id, at, data in qs.order_by("id").values_list(
        "event_type", "attempt", "worker_id", "created_at", "data"
    ):
        if kind == EventType.CLAIMED:
            workers[attempt] = worker_id
        elif kind == EventType.RELEASED:
            workers.pop(attempt + 1, None)
        elif kind == EventType.STARTED:
            first, last = first or at, at
        elif data:
            errors.append((data.get("exception_class_path", ""), data.get("traceback", "")))
    return AttemptHistory(
        worker_ids=tuple(workers[n] for n in sorted(workers)),
        first_started_at=first,
        last_started_at=last,
        errors=tuple(errors),
    )
