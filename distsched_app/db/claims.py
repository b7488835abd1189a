"""The claim of waiting runs in one statement on PostgreSQL: every claim that does not look
for expired leases (most of them; a woken worker's among them).

Through the ORM the claim is four statements and a transaction, and on a woken
idle worker building them costs more than running them: a few milliseconds
between a notification and the task's start. Here
the same claim is one data-modifying statement, built once per shape: lock the due
runs outside paused queues, of tasks the worker may take (``FOR UPDATE SKIP
LOCKED``, in the order the claim index gives), mark
the first ``started`` of them ``running`` and the rest ``leased``, append
their ``claimed`` (and ``started``) events, and return the runs with their
schedules. The rules are ``claim_runs``'; only the number of round trips differs.
Expired leases are not looked at here (``claim_runs`` does that, about once a
second).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from django.db import connection
from django.db.models import Field, Model

from ..models import WAITING_STATES, EventType, Run, RunEvent, RunState, Schedule, not_paused_sql


def _q(name: str) -> str:
    return connection.ops.quote_name(name)


def _columns(model: type[Model]) -> list[Field]:
    return list(model._meta.concrete_fields)


@cache
def _claim_sql(queues: int, excluded: int = 0) -> str:
    """The statement for a worker of ``queues`` queues (0: any queue) that may not take runs of
    ``excluded`` tasks (their required capabilities it lacks; 0: no clause)."""
    runs, events, schedules = _q(Run._meta.db_table), _q(RunEvent._meta.db_table), _q(Schedule._meta.db_table)
    waiting = ", ".join(f"'{s}'" for s in WAITING_STATES)  # literals: the partial claim index's predicate
    # One placeholder per queue, as the ORM writes it: "queue IN ('default')" lets the planner walk
    # the claim index (queue, priority DESC, available_at, id) in order; "queue = ANY(array)" made
    # it read and sort every waiting run.
    queue = f" AND queue IN ({', '.join(f'%(q{i})s' for i in range(queues))})" if queues else ""
    # Paused queues' runs are not claimed: the rule RunQuerySet.claimable states, from the same function.
    unpaused = f" AND {not_paused_sql(f'{runs}.queue')}"
    # Tasks whose required capabilities this worker lacks (services.capabilities), one placeholder each.
    if excluded:
        unpaused += f" AND task_name NOT IN ({', '.join(f'%(x{i})s' for i in range(excluded))})"
    run_cols = ", ".join(f"c.{_q(f.column)}" for f in _columns(Run))
    schedule_cols = ", ".join(f"s.{_q(f.column)}" for f in _columns(Schedule))
    return (
        f"WITH picked AS (SELECT id, priority, available_at FROM {runs} "  # noqa: S608 - names and enum literals
        f"WHERE state IN ({waiting}) AND available_at <= %(now)s{queue}{unpaused} "
        "ORDER BY priority DESC, available_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED), "
        "ranked AS (SELECT id, row_number() OVER (ORDER BY priority DESC, available_at, id) AS n FROM picked), "
        f"claimed AS (UPDATE {runs} AS r SET "
        f"state = CASE WHEN ranked.n <= %(started)s THEN '{RunState.RUNNING.value}' "
        f"ELSE '{RunState.LEASED.value}' END, "
        "lease_owner = %(owner)s, lease_expires_at = %(expires)s, attempts = r.attempts + 1, "
        "started_at = CASE WHEN ranked.n <= %(started)s THEN %(now)s ELSE r.started_at END, updated_at = %(now)s "
        "FROM ranked WHERE r.id = ranked.id RETURNING r.*, ranked.n AS claim_order), "
        f"logged AS (INSERT INTO {events} (run_id, event_type, message, worker_id, attempt, created_at) "
        f"SELECT id, '{EventType.CLAIMED.value}', '', %(owner)s, attempts, %(now)s FROM "
        "(SELECT id, attempts, claim_order FROM claimed ORDER BY claim_order) AS c1 "
        f"UNION ALL SELECT id, '{EventType.STARTED.value}', '', %(owner)s, attempts, %(now)s FROM "
        "(SELECT id, attempts, claim_order FROM claimed WHERE claim_order <= %(started)s ORDER BY claim_order) AS c2) "
        f"SELECT {run_cols}, {schedule_cols} FROM claimed AS c LEFT JOIN {schedules} AS s ON s.id = c.schedule_id "
        "ORDER BY c.claim_order"
    )


@cache
def _converters(model: type[Model]) -> list[tuple[str, list[Any], Any]]:
    """Per column: its attribute name, the converters Django applies when it reads it, the column expression."""
    out = []
    for f in _columns(model):
        col = f.get_col(model._meta.db_table)
        out.append((f.attname, connection.ops.get_db_converters(col) + col.get_db_converters(connection), col))
    return out


def _instance(model: type[Model], values: Sequence[Any]) -> Any:
    names, converted = [], []
    for (name, converters, col), value in zip(_converters(model), values, strict=True):
        for convert in converters:
            value = convert(value, col, connection)
        names.append(name)
        converted.append(value)
    return model.from_db(connection.alias, names, converted)


def claim_waiting(
    *,
    worker_id: str,
    queues: Sequence[str] | None,
    lease_seconds: float,
    now: datetime,
    limit: int,
    start_all: bool,
    excluded_tasks: Sequence[str] = (),
) -> list[Run] | None:
    """``claim_runs(include_expired=False)`` in one statement; None where there is no such
    statement (SQLite has no data-modifying CTEs: the caller claims through the ORM)."""
    if connection.vendor != "postgresql":
        return None
    queues = list(queues or ())
    excluded = list(excluded_tasks)
    params: dict[str, Any] = {
        **{f"q{i}": queue for i, queue in enumerate(queues)},
        **{f"x{i}": task_name for i, task_name in enumerate(excluded)},
        "now": now,
        "limit": limit,
        "started": limit if start_all else 1,
        "owner": worker_id,
        "expires": now + timedelta(seconds=lease_seconds),
    }
    with connection.cursor() as cursor:
        cursor.execute(_claim_sql(len(queues), len(excluded)), params)
        rows = cursor.fetchall()
    width = len(_columns(Run))
    claimed = []
    for row in rows:
        run = _instance(Run, row[:width])
        schedule = _instance(Schedule, row[width:]) if run.schedule_id is not None else None
        Run.schedule.field.set_cached_value(run, schedule)
        claimed.append(run)
    return claimed
