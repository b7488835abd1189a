"""New runs that are not a schedule's slots: enqueued by code, or triggered by an operator.

Each new run gets its ``created`` event and an idempotency key that names its
own id (``enqueued:<id>``, ``manual:<id>``), written in as few statements as
each vendor allows, inside the caller's transaction:

- PostgreSQL: one statement. An enqueue calls ``distsched_enqueue_run`` (a PL/pgSQL
  function, migration 0025): ``nextval`` gives the id before the INSERT, then it inserts
  the run and its event and notifies the run's queue. Its INSERTs are planned once per
  connection, where a statement sent as text is parsed and planned on every call (about a
  quarter of an enqueue's time). A trigger is one statement too: ``nextval`` and a
  data-modifying CTE insert the run and its event together.
- SQLite: an enqueue without a unique key is one statement, an INSERT into the view
  ``distsched_enqueue_run`` (migration 0028) whose INSTEAD OF trigger inserts the run and
  its event. A writing statement takes the write lock before it reads, so the id it
  computes, the next one the table would give (``AUTOINCREMENT`` never reuses ids), is
  its own; outside the caller's transaction it is its own transaction (no ``BEGIN``, no
  COMMIT sent from Python: a quarter of an enqueue's time). With a unique key, or for a
  trigger, two statements (it has no data-modifying CTEs) under the write lock that
  ``BEGIN IMMEDIATE`` took.

A unique key (``Run.unique_key``) makes the INSERT ``ON CONFLICT DO NOTHING``
against the partial unique index of active runs, ``(task_name, unique_key)``: a
duplicate (an active run of the same task with that key) inserts nothing and
returns no row, and never aborts the caller's transaction.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from django.db import connection, transaction

from ..models import EventType, Origin, Run, RunEvent, RunState, Schedule
from ..text import StorableJSONDecoder
from . import notify
from .bulk import server_side_execute
from .notify import CHANNEL

# PostgreSQL's enqueue (migration 0025): one run and its event, its id back (NULL: the unique key is taken).
# SQLite's (migration 0028): a view of that name whose INSTEAD OF trigger writes the run and its event.
ENQUEUE_FUNCTION = "distsched_enqueue_run"
# The partial unique index of active runs with a key (per task), as ON CONFLICT must name it.
_ACTIVE_KEY = "(state IN ('pending', 'leased', 'running', 'retrying', 'blocked') AND NOT (unique_key = ''))"


@dataclass(frozen=True, kw_only=True)
class NewRun:
    """An enqueued run's own values (the rest is the same for every new run)."""

    task_name: str
    args: list[Any]
    kwargs: dict[str, Any]
    scheduled_for: datetime
    max_attempts: int
    queue: str
    priority: int
    retry_policy: dict[str, Any] | None
    unique_key: str = ""
    args_json: str = "[]"  # args and kwargs as stored (validated and encoded once, by the caller)
    kwargs_json: str = "{}"
    trace_context: dict[str, str] | None = None  # the enqueuer's trace (``tracing.carrier()``)
    backend: str | None = None  # the TASKS alias of the framework backend that enqueued it


def _q(name: str) -> str:
    return connection.ops.quote_name(name)


def _tables() -> tuple[str, str]:
    return _q(Run._meta.db_table), _q(RunEvent._meta.db_table)


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


def _adapt(value: datetime) -> Any:
    return connection.ops.adapt_datetimefield_value(value)


def execute(sql: str, params: Sequence[Any]) -> list[tuple]:
    """One statement through Django's cursor (client-side binding: one round trip, and seen
    by Django's query log like any ORM statement)."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def _event_sql(source: str) -> str:
    _, events = _tables()
    return (
        f"INSERT INTO {events} (run_id, event_type, message, worker_id, attempt, created_at) "  # noqa: S608
        f"SELECT id, '{EventType.CREATED.value}', %s, '', 0, %s FROM {source}"
    )


_ENQUEUE_COLUMNS = (
    "id, task_name, args, kwargs, state, scheduled_for, available_at, attempts, max_attempts, lease_owner, "
    "last_error, queue, origin, idempotency_key, cancel_requested, created_at, updated_at, priority, "
    "retry_policy, unique_key, trace_context, backend"
)


# PostgreSQL: the function's arguments, in its order; it writes the run and its event, takes the
# unique key's ON CONFLICT path when there is one, and notifies the channel it is given (NULL: none).
_ENQUEUE_CALL = (
    f"SELECT {ENQUEUE_FUNCTION}(%s, %s::jsonb, %s::jsonb, %s, %s, %s, %s, %s, %s::jsonb, %s, %s::jsonb, %s, %s, %s)"
)


@cache
def _sqlite_enqueue_sql() -> tuple[str, str]:
    """SQLite's two statements of one enqueue with a unique key, built once (the hot path of a web request)."""
    runs, events = _tables()
    return (
        f"INSERT INTO {runs} ({_ENQUEUE_COLUMNS}) SELECT n.id, %s, %s, %s, %s, %s, %s, 0, %s, '', '', %s, %s, "  # noqa: S608
        f"%s || n.id, 0, %s, %s, %s, %s, %s, %s, %s FROM ({_next_id_sql()}) AS n WHERE true "
        f"ON CONFLICT (task_name, unique_key) WHERE {_ACTIVE_KEY} DO NOTHING RETURNING id",
        f"INSERT INTO {events} (run_id, event_type, message, worker_id, attempt, created_at) "  # noqa: S608
        "VALUES (%s, %s, %s, '', 0, %s)",
    )


@cache
def _sqlite_enqueue_view_sql() -> str:
    """SQLite's one statement of an enqueue without a unique key: the run's values and the event's
    message into the view (migration 0028), the id computed in the statement and returned."""
    return (
        f"INSERT INTO {_q(ENQUEUE_FUNCTION)} ({_ENQUEUE_COLUMNS}, message) SELECT n.id, %s, %s, %s, %s, %s, %s, 0, "  # noqa: S608
        f"%s, '', '', %s, %s, %s || n.id, 0, %s, %s, %s, %s, '', %s, %s, %s FROM ({_next_id_sql()}) AS n RETURNING id"
    )


def insert_enqueued(new: NewRun, *, now: datetime, message: str) -> int | None:
    """Insert one enqueued run with its ``created`` event; its id, or None if its unique key
    belongs to an active run already."""
    at, slot = _adapt(now), _adapt(new.scheduled_for)
    if connection.vendor == "postgresql":
        wake = notify.enabled() and new.scheduled_for <= now  # a deferred run is found by the workers' timers
        params = [
            new.task_name, new.args_json, new.kwargs_json, slot, new.max_attempts, new.queue, at, new.priority,
            _json(new.retry_policy), new.unique_key, _json(new.trace_context), new.backend, message,
            CHANNEL if wake else None,
        ]  # fmt: skip
        return execute(_ENQUEUE_CALL, params)[0][0]
    params = [
        new.task_name, new.args_json, new.kwargs_json, RunState.PENDING.value, slot, slot, new.max_attempts,
        new.queue, Origin.ENQUEUED.value, f"{Origin.ENQUEUED.value}:", at, at, new.priority, _json(new.retry_policy),
    ]  # fmt: skip
    if not new.unique_key:
        # One statement: the run and its event together, in the caller's transaction or as its own.
        return execute(_sqlite_enqueue_view_sql(), [*params, _json(new.trace_context), new.backend, message])[0][0]
    run_sql, event_sql = _sqlite_enqueue_sql()
    # Outside a transaction, BEGIN IMMEDIATE: the write lock makes the next id ours. Inside the
    # caller's (already IMMEDIATE) one, no savepoint: two plain statements.
    with nullcontext() if connection.in_atomic_block else transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(run_sql, [*params, new.unique_key, _json(new.trace_context), new.backend])
            row = cursor.fetchone()
            if row is None:
                return None
            cursor.execute(event_sql, [row[0], EventType.CREATED.value, message, at])
        return row[0]


def _next_id_sql() -> str:
    """SQLite: the id ``AUTOINCREMENT`` would give the next row (never a reused one)."""
    runs, _ = _tables()
    return (
        "SELECT MAX(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = "  # noqa: S608
        f"'{Run._meta.db_table}'), 0), COALESCE((SELECT MAX(id) FROM {runs}), 0)) + 1 AS id"
    )


def insert_enqueued_many(new: Sequence[NewRun], *, now: datetime, message: str) -> list[int]:
    """Insert many enqueued runs (no unique keys) with their events; ids in the given order.

    PostgreSQL: one statement over arrays bound on the server. SQLite: the ids are
    taken as a block under the write lock, then rows and events go in chunks.
    """
    if not new:
        return []
    runs, events = _tables()
    if connection.vendor == "postgresql":
        sql = (
            "WITH u AS (SELECT nextval(pg_get_serial_sequence(%s, 'id')) AS id, u.* FROM "  # noqa: S608
            "(SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::timestamptz[], %b::integer[], "
            "%b::text[], %b::smallint[], %b::text[], %b::text[]) WITH ORDINALITY AS u(task_name, args, kwargs, slot, "
            "max_attempts, queue, priority, retry_policy, trace_context, ord) ORDER BY ord) AS u), "
            f"r AS (INSERT INTO {runs} (id, task_name, args, kwargs, state, scheduled_for, available_at, attempts, "
            "max_attempts, lease_owner, last_error, queue, origin, idempotency_key, cancel_requested, created_at, "
            "updated_at, priority, retry_policy, trace_context) SELECT id, task_name, args::jsonb, kwargs::jsonb, %b, "
            "slot, slot, 0, max_attempts, '', '', queue, %b, %b || id, false, %b, %b, priority, retry_policy::jsonb, "
            "trace_context::jsonb FROM u "
            "ORDER BY ord RETURNING id), "
            f"e AS (INSERT INTO {events} (run_id, event_type, message, worker_id, attempt, created_at) "
            f"SELECT id, '{EventType.CREATED.value}', %b, '', 0, %b FROM r) SELECT id FROM r"
        )
        params = [
            Run._meta.db_table, [n.task_name for n in new], [n.args_json for n in new],
            [n.kwargs_json for n in new], [n.scheduled_for for n in new], [n.max_attempts for n in new],
            [n.queue for n in new], [n.priority for n in new], [_json(n.retry_policy) for n in new],
            [_json(n.trace_context) for n in new], RunState.PENDING.value, Origin.ENQUEUED.value,
            f"{Origin.ENQUEUED.value}:", now, now, message, now,
        ]  # fmt: skip
        ids = sorted(row[0] for row in server_side_execute(sql, params))
        notify.notify(n.queue for n in new if n.scheduled_for <= now)
        return ids
    from . import bulk

    with transaction.atomic():
        first = execute(_next_id_sql(), [])[0][0]
        ids = list(range(first, first + len(new)))
        bulk.insert_rows(
            Run,
            {
                "id": ids,
                "task_name": [n.task_name for n in new],
                "args": [n.args_json for n in new],
                "kwargs": [n.kwargs_json for n in new],
                "state": [RunState.PENDING.value] * len(new),
                "scheduled_for": [n.scheduled_for for n in new],
                "available_at": [n.scheduled_for for n in new],
                "attempts": [0] * len(new),
                "max_attempts": [n.max_attempts for n in new],
                "lease_owner": [""] * len(new),
                "last_error": [""] * len(new),
                "queue": [n.queue for n in new],
                "origin": [Origin.ENQUEUED.value] * len(new),
                "idempotency_key": [f"{Origin.ENQUEUED.value}:{i}" for i in ids],
                "cancel_requested": [False] * len(new),
                "created_at": [now] * len(new),
                "updated_at": [now] * len(new),
                "priority": [n.priority for n in new],
                "retry_policy": [_json(n.retry_policy) for n in new],
                "trace_context": [_json(n.trace_context) for n in new],
            },
        )
        bulk.insert_rows(
            RunEvent,
            {
                "run": ids,
                "event_type": [EventType.CREATED.value] * len(new),
                "message": [message] * len(new),
                "worker_id": [""] * len(new),
                "attempt": [0] * len(new),
                "created_at": [now] * len(new),
            },
        )
    return ids


@dataclass(frozen=True, kw_only=True)
class Triggered:
    """What a trigger copied from its schedule row into the new run."""

    run_id: int
    schedule_id: int
    task_name: str
    args: list[Any]
    kwargs: dict[str, Any]
    max_attempts: int
    queue: str
    trace_context: dict[str, str] | None
    schedule_version: int | None = None


def insert_triggered(
    schedule_name: str, *, now: datetime, message: str, trace_context: dict[str, str] | None = None
) -> Triggered | None:
    """One manual run of the named schedule, now, with its event; None if there is no such schedule.

    Task, payload, budget and queue are copied from the schedule row by the database.
    """
    runs, events = _tables()
    schedules = _q(Schedule._meta.db_table)
    columns = (
        "id, schedule_id, task_name, args, kwargs, state, scheduled_for, available_at, attempts, max_attempts, "
        "lease_owner, last_error, queue, origin, idempotency_key, cancel_requested, created_at, updated_at, "
        "trace_context, schedule_version"
    )
    back = "id, schedule_id, task_name, args, kwargs, max_attempts, queue, schedule_version"
    key = f"{Origin.MANUAL.value}:"
    if connection.vendor == "postgresql":
        sql = (
            f"WITH s AS (SELECT nextval(pg_get_serial_sequence(%s, 'id')) AS id, x.id AS schedule_id, "  # noqa: S608
            f"x.task_name, x.args, x.kwargs, x.max_attempts, x.queue, x.version FROM {schedules} x WHERE x.name = %s), "
            f"r AS (INSERT INTO {runs} ({columns}) SELECT s.id, s.schedule_id, s.task_name, s.args, s.kwargs, %s, "
            f"%s, %s, 0, s.max_attempts, '', '', s.queue, %s, %s || s.id, false, %s, %s, %s::jsonb, s.version FROM s "
            f"RETURNING {back}), "
            f"e AS ({_event_sql('r')}) SELECT {back}"
            + (f", pg_notify('{CHANNEL}', queue) FROM r" if notify.enabled() else " FROM r")
        )
        params = [Run._meta.db_table, schedule_name, RunState.PENDING.value, _adapt(now), _adapt(now),
                  Origin.MANUAL.value, key, _adapt(now), _adapt(now), _json(trace_context), message,
                  _adapt(now)]  # fmt: skip
        rows = execute(sql, params)
    else:
        with nullcontext() if connection.in_atomic_block else transaction.atomic():
            sql = (
                f"INSERT INTO {runs} ({columns}) SELECT n.id, x.id, x.task_name, x.args, x.kwargs, %s, %s, %s, 0, "  # noqa: S608
                f"x.max_attempts, '', '', x.queue, %s, %s || n.id, 0, %s, %s, %s, x.version FROM {schedules} x, "
                f"({_next_id_sql()}) "
                f"AS n WHERE x.name = %s RETURNING {back}"
            )
            params = [RunState.PENDING.value, _adapt(now), _adapt(now), Origin.MANUAL.value, key, _adapt(now),
                      _adapt(now), _json(trace_context), schedule_name]  # fmt: skip
            rows = execute(sql, params)
            if rows:
                execute(
                    f"INSERT INTO {events} (run_id, event_type, message, worker_id, attempt, created_at) "  # noqa: S608
                    "VALUES (%s, %s, %s, '', 0, %s)",
                    [rows[0][0], EventType.CREATED.value, message, _adapt(now)],
                )
    if not rows:
        return None
    run_id, schedule_id, task_name, args, kwargs, max_attempts, queue, version = rows[0][:8]
    return Triggered(
        run_id=run_id,
        schedule_id=schedule_id,
        task_name=task_name,
        args=_decoded(args),
        kwargs=_decoded(kwargs),
        max_attempts=max_attempts,
        queue=queue,
        trace_context=trace_context,
        schedule_version=version,
    )


def _decoded(value: Any) -> Any:
    return json.loads(value, cls=StorableJSONDecoder) if isinstance(value, str | bytes) else value
