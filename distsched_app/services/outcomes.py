"""Fenced outcomes: what a worker may record about a run it holds.

Every update is conditional on ``lease_owner = me AND attempts = my attempt``
(the fencing token). A worker whose lease expired and was taken over changes
nothing: its late result is discarded and ``lease_lost`` is recorded, so a
zombie can never overwrite the outcome of the attempt that replaced it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction

from ..backoff import RetryPolicy
from ..clock import iso_utc
from ..conf import conf
from ..db import bulk, fencing, heartbeat, locks, notify
from ..models import LEASED_STATES, EventType, Run, RunState
from ..text import storable, storable_json
from . import events, handback, limits, task_options, workers, workflow_release


def truncate_error(text: str, limit: int | None = None) -> str:
    """A stored error: storable (``text.storable``), at most ``limit`` characters
    (default ``MAX_ERROR_CHARS``), its head and its tail (where the raise is) kept."""
    return storable(text, limit or conf.MAX_ERROR_CHARS, keep_tail=True)


def retry_policy_of(run: Run) -> RetryPolicy:
    """An enqueued run carries its own policy; a scheduled run follows its schedule's."""
    if run.retry_policy:
        return RetryPolicy.from_json(run.retry_policy)
    schedule = run.schedule
    if schedule is None:  # an enqueued run written without a policy (by hand): the settings' defaults
        return RetryPolicy(max_attempts=conf.MAX_ATTEMPTS, base=conf.RETRY_BASE_SECONDS, cap=conf.RETRY_MAX_SECONDS)
    return RetryPolicy(
        max_attempts=schedule.max_attempts,
        base=schedule.retry_base_seconds,
        cap=schedule.retry_max_seconds,
        jitter=schedule.retry_jitter,
    )


def storable_result(value: object) -> object:
    """How a task's return value is stored: plain JSON, else a bounded repr (``text.storable_json``)."""
    return storable_json(value, max_bytes=conf.MAX_PAYLOAD_BYTES)


def _fenced(run_id: int, worker_id: str, attempt: int):
    return Run.objects.filter(pk=run_id, lease_owner=worker_id, attempts=attempt, state__in=LEASED_STATES)


def record_failure(
    *,
    run_id: int,
    worker_id: str,
    attempt: int,
    now: datetime,
    error: str,
    traceback_text: str = "",
    cancelled: bool = False,
    final: bool = False,
    rand: Callable[[], float] = random.random,
    started_at: datetime | None = None,
    record_started: bool = False,
    exception_class_path: str = "",
    exception_type: type[BaseException] | None = None,
) -> str | None:
    """Record a failed attempt: retrying with backoff, dead, or cancelled.

    ``cancelled`` means the task raised RunCancelled. A failure after a cancel
    request also ends ``cancelled``, never ``retrying``. ``exception_class_path``
    and the traceback are kept on the ``failed`` event (django.tasks reads them
    as the attempt's ``TaskError``). ``final`` ends the run dead whatever attempts are left
    (a failure no retry can help, such as arguments that cannot be decoded). Returns the
    new state, or None when the lease was lost. ``exception_type`` (the class the task raised, as
    the worker caught it) decides with the task's ``retry_on``/``give_up_on`` options
    (``task_options.give_up_reason``) whether a retry may help; if not, the run ends dead now.
    """
    with transaction.atomic():
        run = locks.row_locked(_fenced(run_id, worker_id, attempt).select_related("schedule"), of=("self",)).first()
        if run is None:
            _lease_lost(run_id, worker_id, attempt, now, "failed")
            return None
        full_error = truncate_error(f"{error}\n\n{traceback_text}".strip())
        detail = (
            {"exception_class_path": storable(exception_class_path), "traceback": truncate_error(traceback_text)}
            if exception_class_path
            else None
        )
        changes: dict[str, object] = {
            "last_error": full_error,
            "lease_owner": "",
            "lease_expires_at": None,
            "updated_at": now,
        }
        new: list[events.NewEvent] = []

        def log(event_type: str, message: str = "", *, at: datetime = now, data: dict | None = None) -> None:
            new.append(
                events.NewEvent(
                    run_id=run_id, event_type=event_type, now=at, worker_id=worker_id, attempt=attempt,
                    message=message, data=data,
                )
            )  # fmt: skip

        if started_at is not None:
            changes["started_at"] = started_at
        if record_started:
            log(EventType.STARTED, at=started_at or now)
        if cancelled or run.cancel_requested:
            changes.update(state=RunState.CANCELLED, finished_at=now)
            if not cancelled:
                log(EventType.FAILED, error, data=detail)
            log(EventType.CANCELLED, error if cancelled else "cancel requested")
        else:
            log(EventType.FAILED, error, data=detail)
            give_up = None if final else task_options.give_up_reason(run.task_name, exception_type)
            if run.attempts < run.max_attempts and not final and give_up is None:
                delay = retry_policy_of(run).delay(run.attempts, rand=rand)
                available = now + timedelta(seconds=delay)
                changes.update(state=RunState.RETRYING, available_at=available)
                if available <= now:
                    notify.notify([run.queue])  # a retry due at once: wake an idle worker
                log(
                    EventType.RETRY_SCHEDULED,
                    f"attempt {run.attempts}/{run.max_attempts} failed; retry in {delay:.1f}s at {iso_utc(available)}",
                )
            else:
                changes.update(state=RunState.DEAD, finished_at=now)
                left = "not retried" if final else f"not retried: {give_up}" if give_up else "no attempts left"
                log(EventType.MARKED_DEAD, f"{left} ({run.attempts}/{run.max_attempts})")
        _fenced(run_id, worker_id, attempt).update(**changes)
        limits.release([run_id], now=now, replaced=[run_id] if run.cancel_requested else ())
        if run.workflow_id is not None and changes["state"] != RunState.RETRYING:
            workflow_release.ended({run_id: str(changes["state"])}, now=now, workflow_ids=[run.workflow_id])
        events.record_many(new)
        return str(changes["state"])


def _lease_lost(run_id: int, worker_id: str, attempt: int, now: datetime, outcome: str) -> None:
    if Run.objects.filter(pk=run_id).exists():
        events.record(
            run_id,
            EventType.LEASE_LOST,
            now=now,
            worker_id=worker_id,
            attempt=attempt,
            message=f"attempt {attempt} by {worker_id} no longer holds the lease; outcome {outcome!r} discarded",
        )


@dataclass(frozen=True, kw_only=True)
class Success:
    """One successful execution waiting to be recorded (batched by the worker)."""

    run_id: int
    attempt: int
    started_at: datetime
    finished_at: datetime
    result: object = None
    record_started: bool = False  # the ``started`` event was not written at claim time
    note: str = ""


def _held_ids(worker_id: str, held: dict[int, int], *, lock: bool = False, extra: tuple = ()) -> dict:
    """Of ``held`` (run id -> attempt), the runs this worker still holds at that
    attempt: the per-run fencing check of a batch, as one indexed query (``db.fencing``)."""
    rows = fencing.held_rows(worker_id, list(held), extra=extra, lock=lock)
    return {row[0]: row[2:] for row in rows if held.get(row[0]) == row[1]}


def record_successes(*, worker_id: str, successes: list[Success], now: datetime) -> set[int]:
    """Record a batch of successes in one transaction, each fenced on its own
    (owner, attempt). Returns the ids whose lease was lost (nothing written for
    them but a ``lease_lost`` event)."""
    if not successes:
        return set()
    # Outside the transaction: serialising a task's return value is the task's business, not the lock's.
    results = {s.run_id: storable_result(s.result) for s in successes if s.result is not None}
    by_id = {s.run_id: s for s in successes}
    with transaction.atomic():
        # Rows are locked (PostgreSQL) or the write lock is held (SQLite
        # IMMEDIATE): nobody can take them over between this check and the update.
        held = _held_ids(
            worker_id, {s.run_id: s.attempt for s in successes}, lock=True, extra=("cancel_requested", "workflow")
        )
        ok = [by_id[run_id] for run_id in held]
        if ok:
            # The UPDATE is written with the release of their limit slots (one round trip on PostgreSQL).
            marked = _mark_succeeded(ok, worker_id, now)
            ids = [s.run_id for s in ok]
            limits.release(ids, now=now, replaced=[i for i in ids if held[i][0]], along=[marked])
            for run_id in ids:
                if results.get(run_id) is not None:
                    Run.objects.filter(pk=run_id).update(result=results[run_id])
            nodes = {s.run_id: held[s.run_id][1] for s in ok if held[s.run_id][1] is not None}
            if nodes:  # runs of workflows: their downstream nodes, in this transaction (after the UPDATE above)
                workflow_release.ended(
                    dict.fromkeys(nodes, RunState.SUCCEEDED.value), now=now, workflow_ids=nodes.values()
                )
        new: list[events.NewEvent] = []
        for s in ok:
            if s.record_started:
                new.append(
                    events.NewEvent(
                        run_id=s.run_id,
                        event_type=EventType.STARTED,
                        now=s.started_at,
                        worker_id=worker_id,
                        attempt=s.attempt,
                    )
                )
            note = s.note or ("returned normally after a cancel request" if held[s.run_id][0] else "")
            new.append(
                events.NewEvent(
                    run_id=s.run_id,
                    event_type=EventType.SUCCEEDED,
                    now=s.finished_at,
                    worker_id=worker_id,
                    attempt=s.attempt,
                    message=note,
                )
            )
        lost = set(by_id) - set(held)
        existing = set(Run.objects.filter(pk__in=lost).values_list("id", flat=True)) if lost else set()
        for run_id in sorted(existing):
            attempt = by_id[run_id].attempt
            new.append(
                events.NewEvent(
                    run_id=run_id,
                    event_type=EventType.LEASE_LOST,
                    now=now,
                    worker_id=worker_id,
                    attempt=attempt,
                    message=f"attempt {attempt} by {worker_id} no longer holds the lease; "
                    "outcome 'succeeded' discarded",
                )
            )
        events.record_many(new)
    return lost


def _mark_succeeded(items: list[Success], worker_id: str, now: datetime) -> bulk.Statement:
    """One UPDATE for the batch, with per-run start and finish times, returned to be written
    along the release (results, rare for no-op style tasks, are set per run after it).

    Plain SQL: on the hot path, compiling ORM ``Case`` expressions cost more
    than the statement. PostgreSQL: the times as arrays joined by id (``db.bulk``), one
    statement text and a few parameters whatever the batch; a ``CASE`` per run there was a
    new text of five parameters a run, which psycopg parsed again on every flush (it caches
    none of more than 50 parameters) and the server planned again.
    """
    ops = connection.ops
    table = ops.quote_name(Run._meta.db_table)
    ids = [s.run_id for s in items]
    if connection.vendor == "postgresql":
        times, columns = bulk.rows_source(
            Run,
            {"id": ids, "started_at": [s.started_at for s in items], "finished_at": [s.finished_at for s in items]},
        )
        sql = (
            f"UPDATE {table} AS r SET state = %s, lease_owner = '', lease_expires_at = NULL, updated_at = %s, "  # noqa: S608
            f"started_at = u.started_at, finished_at = u.finished_at FROM {times} "
            "WHERE r.id = u.id AND r.lease_owner = %s"
        )
        return bulk.Statement(sql, [RunState.SUCCEEDED.value, now, *columns, worker_id])
    cases = []
    adapt = bulk.datetime_adapter()
    params: list[Any] = [RunState.SUCCEEDED.value, adapt(now)]
    for column in ("started_at", "finished_at"):
        cases.append(f"{column} = CASE id " + " ".join(["WHEN %s THEN %s"] * len(items)) + " END")
        for s in items:
            params += [s.run_id, adapt(getattr(s, column))]
    placeholders = ", ".join(["%s"] * len(ids))
    sql = (
        f"UPDATE {table} SET state = %s, lease_owner = '', lease_expires_at = NULL, updated_at = %s, "  # noqa: S608
        f"{', '.join(cases)} WHERE id IN ({placeholders}) AND lease_owner = %s"
    )
    return bulk.Statement(sql, [*params, *ids, worker_id])


@dataclass(frozen=True, kw_only=True)
class Renewal:
    held: set[int]
    cancel_requested: set[int]
    alive: bool | None = None  # with ``row``: whether the worker row was there (False: re-register)


def renew_leases(
    *, worker_id: str, held: dict[int, int], now: datetime, lease_seconds: float, row: heartbeat.RowBeat | None = None
) -> Renewal:
    """Extend the leases of every run a worker holds (current and prefetched), each fenced on
    its (owner, attempt); with ``row``, move the worker row in the same transaction: the
    whole heartbeat as one commit (one statement on PostgreSQL, ``db.heartbeat``)."""
    if not held and row is None:
        return Renewal(held=set(), cancel_requested=set())
    expires = now + timedelta(seconds=lease_seconds)
    if connection.vendor == "postgresql":
        beat = heartbeat.beat(worker_id=worker_id, held=held, now=now, expires=expires, row=row)
        return Renewal(
            held=set(beat.renewed), cancel_requested={r for r, c in beat.renewed.items() if c}, alive=beat.alive
        )
    alive = None
    with transaction.atomic():
        still = _held_ids(worker_id, held, lock=True, extra=("cancel_requested",)) if held else {}
        if still:
            Run.objects.filter(pk__in=list(still), lease_owner=worker_id).update(
                lease_expires_at=expires, updated_at=now
            )
        if row is not None:
            alive = workers.heartbeat(
                worker_id=worker_id,
                now=row.heartbeat_at,
                status=row.status,
                current_run_id=row.current_run_id,
                runs_executed=row.runs_executed,
                clock_skew_seconds=row.clock_skew_seconds,
            )
    return Renewal(held=set(still), cancel_requested={r for r, (c,) in still.items() if c}, alive=alive)


def mark_running(*, run_id: int, worker_id: str, attempt: int, started_at: datetime, now: datetime) -> bool:
    """A prefetched (``leased``) run has been executing for a while: show it as running."""
    with transaction.atomic():
        updated = (
            _fenced(run_id, worker_id, attempt)
            .filter(state=RunState.LEASED)
            .update(state=RunState.RUNNING, started_at=started_at, updated_at=now)
        )
        if updated:
            events.record(run_id, EventType.STARTED, now=started_at, worker_id=worker_id, attempt=attempt)
    return bool(updated)


def mark_many_running(*, worker_id: str, held: dict[int, int], now: datetime) -> set[int]:
    """Show prefetched (``leased``) runs as running from ``now``, in one transaction (fenced): a
    worker starting a batch of framework tasks, whose results must read RUNNING while they execute.
    Returns the ids marked. Their outcome later writes each one's exact ``started_at``."""
    if not held:
        return set()
    with transaction.atomic():
        rows = _held_ids(worker_id, held, lock=True, extra=("state",))
        ids = [run_id for run_id, (state,) in rows.items() if state == RunState.LEASED]
        if ids:
            Run.objects.filter(pk__in=ids, lease_owner=worker_id, state=RunState.LEASED).update(
                state=RunState.RUNNING, started_at=now, updated_at=now
            )
            events.record_many(
                events.NewEvent(
                    run_id=run_id, event_type=EventType.STARTED, now=now, worker_id=worker_id, attempt=held[run_id]
                )
                for run_id in ids
            )
    return set(ids)


def release_runs(*, worker_id: str, held: dict[int, int], now: datetime) -> int:
    """Give back prefetched runs that were never started (worker stopping).

    Their attempt was never handed to task code, so it is returned too: the
    next claim issues the same fencing token to the first real execution.
    """
    if not held:
        return 0
    with transaction.atomic():
        ids = [
            r
            for r, (state,) in _held_ids(worker_id, held, lock=True, extra=("state",)).items()
            if state == RunState.LEASED
        ]
        if not ids:
            return 0
        handback.hand_back(ids, worker_id=worker_id, states=[RunState.LEASED], available_at=now, now=now)
        events.record_many(
            events.NewEvent(
                run_id=run_id,
                event_type=EventType.RELEASED,
                now=now,
                worker_id=worker_id,
                attempt=held[run_id] - 1,
                message=f"returned unstarted by {worker_id}",
            )
            for run_id in ids
        )
    return len(ids)


def note_unrecorded(*, worker_id: str, held: dict[int, int], outcome: str, error: str, now: datetime) -> None:
    """History for runs whose outcome could not be recorded: they keep their lease, which
    expires, and they are executed again. Only an event is written (one transaction)."""
    existing = set(Run.objects.filter(pk__in=list(held)).values_list("id", flat=True))
    with transaction.atomic():
        events.record_many(
            events.NewEvent(
                run_id=run_id,
                event_type=EventType.RECORD_FAILED,
                now=now,
                worker_id=worker_id,
                attempt=held[run_id],
                message=f"attempt {held[run_id]} ended {outcome}, but the outcome could not be recorded ({error}); "
                "the lease will expire and the run be executed again",
            )
            for run_id in sorted(existing)
        )
