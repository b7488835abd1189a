"""Claiming: a worker takes ownership of due runs under an expiring lease.

One transaction per claim. PostgreSQL locks candidate rows with
``FOR UPDATE SKIP LOCKED`` so concurrent workers never block on, or take, the
same run; SQLite's ``BEGIN IMMEDIATE`` serialises claimers on the write lock.
The UPDATE then filters on the primary keys alone, and that is enough: from
the SELECT to the COMMIT the rows are locked (PostgreSQL re-reads a locked
row's latest version and re-checks the WHERE before handing it over) or the
whole database is (SQLite), so nobody can change them in between. A backend
with neither would need a compare-and-set on the state and attempt read here.

Runs of a paused queue (``services.queues``) are not claimed: the waiting runs
come from ``Run.objects.claimable``, and an expired lease in a paused queue is
recovered (dead when out of attempts) but put back to pending, not re-claimed.

Runs of a task whose required capabilities (``DISTSCHED["TASK_REQUIRES"]``,
``services.capabilities``) the worker lacks are not claimed either: both paths
add ``task_name NOT IN (...)``, computed from the setting on each claim. An
expired lease of such a run is recovered like one in a paused queue (dead when
out of attempts, else back to pending), so a capable worker claims it next and
the run shows as waiting meanwhile, not as running under a dead owner.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from django.db import connection, transaction
from django.db.models import F

from .. import tracing
from ..clock import iso_utc
from ..db import claims, locks
from ..models import EventType, Run, RunEvent, RunQuerySet, RunState, Schedule
from . import capabilities as capability_service
from . import events, limit_rules, workflow_release
from . import limits as limit_service
from . import queues as queue_service


def _lock(qs: RunQuerySet) -> RunQuerySet:
    return locks.skip_locked(qs.select_related("schedule"), of=("self",))


def _claim_attributes(
    runs: list[Run], *, worker_id: str, queues: Sequence[str] | None = None, **_: object
) -> dict[str, str | int]:
    return {
        "messaging.operation.type": "receive",
        "distsched.worker.id": worker_id,
        "distsched.queues": ",".join(queues or ()),
        "distsched.claim.runs": len(runs),
        "distsched.claim.run_ids": ",".join(str(r.pk) for r in runs),
    }


@tracing.when_busy("distsched.claim", _claim_attributes)
def claim_runs(
    *,
    worker_id: str,
    queues: Sequence[str] | None,
    lease_seconds: float,
    now: datetime,
    limit: int = 1,
    include_expired: bool = True,
    start_all: bool = False,
    capabilities: Sequence[str] = (),
    skip_tasks: Sequence[str] = (),
) -> list[Run]:
    """Claim up to ``limit`` runs: expired leases first, then due runs by time (a span
    ``distsched.claim`` when it claimed any, with OpenTelemetry).

    Every claimed run is owned by ``worker_id`` until ``now + lease_seconds``
    with ``attempts`` incremented (its own fencing token). The first run is
    ``running`` (the worker starts it now); with ``limit > 1`` the others are
    ``leased``: prefetched, started later by the same worker, their leases
    renewed by its heartbeat. A run whose lease expired with no attempts left
    is marked dead instead; one whose cancel was requested is cancelled
    instead of run again. ``include_expired=False`` skips the lease-recovery
    query (a worker checks it periodically, not on every claim).
    ``start_all`` marks every claimed run ``running`` (a worker with that many
    free threads starts them all at once). ``capabilities`` are the worker's: runs of a
    task that requires others are left alone (``services.capabilities``), and so are runs of
    ``skip_tasks`` (tasks the worker has not registered: ``worker.guard``).
    """
    excluded = sorted({*capability_service.excluded_tasks(capabilities), *skip_tasks})
    limited = limit_rules.may_apply(queues)  # admission is the ORM path's: the statement does not admit
    if not include_expired and not limited:  # waiting runs only: one statement where the database allows it
        claimed = claims.claim_waiting(
            worker_id=worker_id,
            queues=queues,
            lease_seconds=lease_seconds,
            now=now,
            limit=limit,
            start_all=start_all,
            excluded_tasks=excluded,
        )
        if claimed is not None:
            return claimed
    queues = list(queues) if queues else None
    expires = now + timedelta(seconds=lease_seconds)
    new_events: list[events.NewEvent] = []
    with transaction.atomic():
        candidates: list[Run] = []
        forgiven: list[int] = []
        if include_expired:
            expired = list(_lock(Run.objects.lease_expired(now, queues))[:limit])
            paused = queue_service.paused_names() if expired else frozenset()  # read only when needed
            for run in expired:
                message = f"lease of {run.lease_owner} expired at {iso_utc(run.lease_expires_at)}"
                if not run.cancel_requested and _never_known_to_start(run):
                    # A prefetched run of a worker that died: most likely never
                    # executed, so its attempt does not count against the budget.
                    # Bounded, so a run that kills its worker still ends dead.
                    run.max_attempts += 1
                    forgiven.append(run.pk)
                    message += "; it was prefetched and never known to start, so the attempt is not counted"
                abandoned = run.cancel_requested or run.attempts >= run.max_attempts
                held = not abandoned and run.queue in paused
                if held:
                    message += f"; queue {run.queue} is paused: back to pending until it is resumed"
                elif not abandoned and run.task_name in excluded:
                    held = True
                    lacking = ", ".join(capability_service.missing_capabilities(run.task_name, capabilities))
                    lacking = lacking or f"task {run.task_name}"  # a skip_tasks name: not registered here
                    message += f"; this worker lacks {lacking}: back to pending for a worker that has it"
                new_events.append(
                    events.NewEvent(
                        run_id=run.pk,
                        event_type=EventType.LEASE_EXPIRED,
                        now=now,
                        worker_id=run.lease_owner,
                        attempt=run.attempts,
                        message=message,
                    )
                )
                if abandoned:
                    _finish_abandoned(run, now, new_events)
                elif held:
                    _back_to_pending(run, now)
                else:
                    candidates.append(run)
            if expired:  # their slots are free now (a re-claimed one is admitted again below)
                limit_service.release(
                    [r.pk for r in expired], now=now, replaced=[r.pk for r in expired if r.cancel_requested]
                )
        if forgiven:
            Run.objects.filter(pk__in=forgiven).update(max_attempts=F("max_attempts") + 1)
        if limited:
            gate = limit_service.Gate(now=now, worker_id=worker_id, slots=limit if start_all else 1)
            candidates = _admitted(candidates, gate, now=now, queues=queues, excluded=excluded, limit=limit)
            new_events += gate.events
        elif len(candidates) < limit:
            candidates += claims.lock_waiting(queues=queues, excluded=excluded, now=now, limit=limit - len(candidates))
        if not candidates:
            events.record_many(new_events, along=gate.writes if limited else (), last=True)
            return []
        # Keys alone suffice: the rows read above are locked until COMMIT (see the module docstring).
        started = candidates if start_all else candidates[:1]
        along = gate.writes if limited else []  # the limit holds admission took
        if connection.vendor == "postgresql":
            # One statement, which also COMMITs: the runs marked, the holds, the events.
            prior = events.columns(new_events)
            if prior is None:  # exception details: the ORM writes those (no claim event has any)
                events.record_many(new_events)
                prior = {}
            claims.write_claim(
                candidates,
                started=len(started),
                worker_id=worker_id,
                expires=expires,
                now=now,
                prior=prior,
                along=along,
            )
            return candidates
        writes = [
            claims.mark_statement(candidates, started=len(started), worker_id=worker_id, expires=expires, now=now),
            *along,
        ]
        for run in candidates:
            new_events.append(
                events.NewEvent(
                    run_id=run.pk,
                    event_type=EventType.CLAIMED,
                    now=now,
                    worker_id=worker_id,
                    attempt=run.attempts,
                )
            )
        for run in started:
            new_events.append(
                events.NewEvent(
                    run_id=run.pk,
                    event_type=EventType.STARTED,
                    now=now,
                    worker_id=worker_id,
                    attempt=run.attempts,
                )
            )
        # The claim's last statement: on PostgreSQL it carries the COMMIT (``bulk.execute``).
        events.record_many(new_events, along=writes, last=True)
    return candidates


# How many times one claim picks again after candidates were held back by limits (each pick
# takes new rows: held-back ones left the claimable set, or are excluded by id).
MAX_PICKS = 5


def _admitted(
    expired: list[Run],
    gate: limit_service.Gate,
    *,
    now: datetime,
    queues: list[str] | None,
    excluded: list[str],
    limit: int,
) -> list[Run]:
    """The candidates the limits admit, picked again while some were held back so that unlimited
    runs behind throttled or blocked ones are claimed now (no head-of-line blocking). Limited
    runs come first: the one run a single-threaded claim starts at once is a limited one, so a
    limited run never waits prefetched while holding its slot."""
    admitted: list[Run] = []
    later: list[int] = []
    for run in expired:
        verdict = gate.admit(run)
        if verdict is limit_service.Verdict.ADMIT:
            admitted.append(run)
        elif verdict is limit_service.Verdict.LATER:
            _back_to_pending(run, now)
            later.append(run.pk)
    for _ in range(MAX_PICKS):
        if len(admitted) >= limit:
            break
        # Admitted ones are still pending in the database until the claim's UPDATE: skipped by id.
        skip = later + [r.pk for r in admitted]
        statement = claims.waiting_statement(
            queues=queues, excluded=excluded, now=now, limit=limit - len(admitted), skip=skip
        )
        rows = gate.pick(statement)  # PostgreSQL: with the partitions it expects to admit into
        picked = claims.read_waiting(statement) if rows is None else claims.runs_from_rows(rows)
        held_back, spilled = 0, gate.spilled
        for run in picked:
            verdict = gate.admit(run)
            if verdict is limit_service.Verdict.ADMIT:
                admitted.append(run)
            else:
                held_back += 1
                if verdict is limit_service.Verdict.LATER:
                    later.append(run.pk)
        if not held_back or gate.spilled - spilled == held_back:
            break  # nothing held back, or only prefetched runs past a full stripe (``Gate.spilled``)
    gate.finish()
    for run in admitted:
        run.limit_tight = run.pk in gate.tight  # type: ignore[attr-defined]  # read by the worker's recorder
    first = set(gate.limited)
    return [r for r in admitted if r.pk in first] + [r for r in admitted if r.pk not in first]


def claim_next_run(
    *,
    worker_id: str,
    queues: Sequence[str] | None,
    lease_seconds: float,
    now: datetime,
    capabilities: Sequence[str] = (),
) -> Run | None:
    """Claim the single oldest eligible run, or return None."""
    runs = claim_runs(
        worker_id=worker_id, queues=queues, lease_seconds=lease_seconds, now=now, limit=1, capabilities=capabilities
    )
    return runs[0] if runs else None


MAX_UNCOUNTED_EXPIRIES = 3


def _never_known_to_start(run: Run) -> bool:
    """Still ``leased`` (claimed in a batch, start not recorded) and not often so."""
    if run.state != RunState.LEASED:
        return False
    expiries = RunEvent.objects.filter(run_id=run.pk, event_type=EventType.LEASE_EXPIRED).count()
    return expiries < MAX_UNCOUNTED_EXPIRIES


def _finish_abandoned(run: Run, now: datetime, new_events: list[events.NewEvent]) -> None:
    """An expired lease that must not run again: cancelled on request, else dead."""
    if run.cancel_requested:
        state, kind, message = RunState.CANCELLED, EventType.CANCELLED, "cancel requested; lease expired"
    else:
        state, kind = RunState.DEAD, EventType.MARKED_DEAD
        message = f"lease expired with no attempts left ({run.attempts}/{run.max_attempts})"
    Run.objects.filter(pk=run.pk, attempts=run.attempts, state=run.state).update(
        state=state,
        finished_at=now,
        lease_owner="",
        lease_expires_at=None,
        updated_at=now,
        last_error=run.last_error or message,
    )
    new_events.append(events.NewEvent(run_id=run.pk, event_type=kind, now=now, attempt=run.attempts, message=message))
    if run.workflow_id is not None:
        workflow_release.ended({run.pk: state.value}, now=now, workflow_ids=[run.workflow_id])


def _back_to_pending(run: Run, now: datetime) -> None:
    """An expired lease in a paused queue, or of a task this worker may not take: waiting again
    (attempt counted, as a re-claim would count it), claimed once the queue is resumed or by a
    worker with the capabilities."""
    Run.objects.filter(pk=run.pk, attempts=run.attempts, state=run.state).update(
        state=RunState.PENDING, lease_owner="", lease_expires_at=None, available_at=now, updated_at=now
    )


@dataclass(frozen=True, kw_only=True)
class NextDue:
    run: datetime | None  # earliest available_at of a claimable run (paused queues' runs and excluded tasks' are not)
    schedule: datetime | None  # earliest next_run_at of an active schedule


def next_due(
    *, queues: Sequence[str] | None, capabilities: Sequence[str] = (), skip_tasks: Sequence[str] = ()
) -> NextDue:
    """When the next claimable run, and the next schedule slot, come due on these
    queues: lets an idle worker sleep until then instead of a full poll. A paused
    queue's runs are left out: a worker would wake for a run it may not claim
    (a resume wakes it by notification, or its next poll). So are runs of tasks whose required
    capabilities the worker lacks."""
    queues = list(queues) if queues else None
    excluded = sorted({*capability_service.excluded_tasks(capabilities), *skip_tasks})
    runs = Run.objects.claimable(datetime.max.replace(tzinfo=timezone.utc), queues, excluded).order_by()
    schedules = Schedule.objects.filter(paused=False, next_run_at__isnull=False).order_by()
    if queues:
        schedules = schedules.filter(queue__in=queues)
    # Both minimums in one statement (one round trip, one transaction per idle poll instead of two):
    # each is the MIN of its filtered rows, as ``aggregate(Min(...))`` would ask it.
    run_sql, run_params = runs.values("available_at").query.sql_with_params()
    schedule_sql, schedule_params = schedules.values("next_run_at").query.sql_with_params()
    sql = (
        f"SELECT (SELECT MIN(r.available_at) FROM ({run_sql}) r),"  # noqa: S608 - the ORM's own SQL
        f" (SELECT MIN(s.next_run_at) FROM ({schedule_sql}) s)"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*run_params, *schedule_params])
        run_at, schedule_at = cursor.fetchone()
    return NextDue(run=_instant(run_at), schedule=_instant(schedule_at))


def _instant(value: object) -> datetime | None:
    """A raw cursor's datetime column: PostgreSQL gives an aware datetime, SQLite the text Django
    stored (UTC), None when no row matched."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)
    return datetime.fromisoformat(str(value)).replace(tzinfo=timezone.utc)
