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
second). With ``DISTSCHED["SYNCHRONOUS_CLAIMS"] = False`` the statement also turns
``synchronous_commit`` off for its own transaction (never inside a caller's): its commit
does not wait for the disk (the PostgreSQL docs page says what a crash can then cost).

SQLite has no data-modifying CTEs; there the same claim is three prepared statements under
the write lock ``BEGIN IMMEDIATE`` takes (read the due runs with their schedules, mark them,
append the events), written once per shape: through the ORM, building the statements cost
more than SQLite took to run them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from functools import cache
from itertools import chain
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Field, Model

from ..conf import conf
from ..models import WAITING_STATES, EventType, Run, RunEvent, RunState, Schedule, not_paused_sql
from . import bulk, timestamps


def _q(name: str) -> str:
    return connection.ops.quote_name(name)


def _columns(model: type[Model]) -> list[Field]:
    return list(model._meta.concrete_fields)


# ``SYNCHRONOUS_CLAIMS = False``: the claim's own transaction commits without waiting for its WAL
# to reach the disk (``synchronous_commit`` off for that transaction only).
_ASYNC_COMMIT = "quick AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true) AS v), "


@cache
def _claim_sql(queues: int, excluded: int = 0, durable: bool = True) -> str:
    """The statement for a worker of ``queues`` queues (0: any queue) that may not take runs of
    ``excluded`` tasks (their required capabilities it lacks; 0: no clause); not ``durable``: its
    commit does not wait for the disk (``claim_waiting``)."""
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
    quick = "" if durable else _ASYNC_COMMIT
    return (
        f"WITH {quick}picked AS (SELECT id, priority, available_at FROM {runs} "  # noqa: S608 - names and enum literals
        f"WHERE state IN ({waiting}) AND available_at <= %(now)s{queue}{unpaused} "
        "ORDER BY priority DESC, available_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED), "
        "ranked AS (SELECT id, row_number() OVER (ORDER BY priority DESC, available_at, id) AS n FROM picked), "
        f"claimed AS (UPDATE {runs} AS r SET "
        f"state = CASE WHEN ranked.n <= %(started)s THEN '{RunState.RUNNING.value}' "
        f"ELSE '{RunState.LEASED.value}' END, "
        "lease_owner = %(owner)s, lease_expires_at = %(expires)s, attempts = r.attempts + 1, "
        "started_at = CASE WHEN ranked.n <= %(started)s THEN %(now)s ELSE r.started_at END, updated_at = %(now)s, "
        "held_by = '' "
        "FROM ranked WHERE r.id = ranked.id RETURNING r.*, ranked.n AS claim_order), "
        f"logged AS (INSERT INTO {events} (run_id, event_type, message, worker_id, attempt, created_at) "
        f"SELECT id, '{EventType.CLAIMED.value}', '', %(owner)s, attempts, %(now)s FROM "
        "(SELECT id, attempts, claim_order FROM claimed ORDER BY claim_order) AS c1 "
        f"UNION ALL SELECT id, '{EventType.STARTED.value}', '', %(owner)s, attempts, %(now)s FROM "
        "(SELECT id, attempts, claim_order FROM claimed WHERE claim_order <= %(started)s ORDER BY claim_order) AS c2) "
        f"SELECT {run_cols}, {schedule_cols} FROM claimed AS c LEFT JOIN {schedules} AS s ON s.id = c.schedule_id "
        # The setting is made while the runs are returned (a claim that takes none writes nothing to wait for).
        f"{'' if durable else 'CROSS JOIN quick '}ORDER BY c.claim_order"
    )


def _sqlite_utc_datetime(value: Any, expression: Any, connection: Any) -> Any:
    """What Django's SQLite converter makes of a stored UTC timestamp (text), without its
    general parsing: a claim reads several per run."""
    if isinstance(value, datetime) and value.tzinfo is None:  # sqlite3's own converter read it
        return value.replace(tzinfo=UTC)
    if isinstance(value, str):
        return datetime.fromisoformat(value).replace(tzinfo=UTC)
    return connection.ops.convert_datetimefield_value(value, expression, connection)


@cache
def _converters(model: type[Model]) -> list[tuple[str, list[Any], Any]]:
    """Per column: its attribute name, the converters Django applies when it reads it, the column expression."""
    utc = connection.vendor == "sqlite" and settings.USE_TZ and connection.timezone_name == "UTC"
    out = []
    for f in _columns(model):
        col = f.get_col(model._meta.db_table)
        converters = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
        if utc and f.get_internal_type() == "DateTimeField" and len(converters) == 1:
            converters = [_sqlite_utc_datetime]
        out.append((f.attname, converters, col))
    return out


@cache
def _builder(model: type[Model]) -> Callable[..., Any]:
    """How a row of ``model``'s columns becomes an instance, as ``Model.from_db`` makes it:
    ``build(values, alias, plain)``.

    The worker builds one run per claimed row (128 a claim on SQLite), and ``from_db``'s
    general path (``Model.__init__`` setting each column through ``setattr``, the init
    signals) cost more than the claim's SQL. ``plain`` (``_plain``: nothing could tell the
    difference), the instance's ``__dict__`` is filled at once: the same attributes, the same
    ``_state``. Otherwise ``from_db`` is called."""
    from django.db.models.base import ModelState

    columns = _converters(model)
    names = [name for name, _, _ in columns]
    # Only the columns with converters are visited per row; NULL stays None for every one of them.
    converted = [(i, tuple(converters), col) for i, (_, converters, col) in enumerate(columns) if converters]

    def build(values: Sequence[Any], alias: str, plain: bool) -> Any:
        row = list(values)
        for i, converters, col in converted:
            value = row[i]
            if value is not None:
                for convert in converters:
                    value = convert(value, col, connection)
                row[i] = value
        if not plain:
            return model.from_db(alias, names, row)
        instance = object.__new__(model)
        state = ModelState()
        state.adding, state.db = False, alias
        instance.__dict__.update(zip(names, row, strict=True))
        instance._state = state
        return instance

    return build


@cache
def _plain_columns(model: type[Model]) -> bool:
    """The model's own ``__init__`` is Django's and its columns are Django's plain attributes (a
    foreign key's ``__set__`` only drops a stale cached object, of which a new instance has none):
    no custom field's ``__set__`` would be skipped by filling ``__dict__``."""
    from django.db.models.fields.related_descriptors import ForeignKeyDeferredAttribute
    from django.db.models.query_utils import DeferredAttribute

    plain = (DeferredAttribute, ForeignKeyDeferredAttribute)
    return model.__init__ is Model.__init__ and all(
        type(model.__dict__.get(f.attname)) in plain for f in _columns(model)
    )


def _plain(model: type[Model]) -> bool:
    """Whether ``_builder`` may skip ``Model.__init__`` now: plain columns, and no ``pre_init`` /
    ``post_init`` receiver for the model (asked per claim: a receiver may be connected any time)."""
    from django.db.models import signals

    return (
        _plain_columns(model)
        and not signals.pre_init.has_listeners(model)
        and not signals.post_init.has_listeners(model)
    )


def _instance(model: type[Model], values: Sequence[Any]) -> Any:
    return _builder(model)(values, connection.alias, _plain(model))


def runs_from_rows(rows: Sequence[Sequence[Any]]) -> list[Run]:
    """Runs from rows of the run's columns then its schedule's (NULLs when it has none), the
    schedule cached on each run as ``select_related`` would."""
    width = len(_columns(Run))
    run_of, schedule_of = _builder(Run), _builder(Schedule)
    schedule_field = Run.schedule.field
    out: list[Run] = []
    alias, plain_run, plain_schedule = connection.alias, _plain(Run), _plain(Schedule)
    for row in rows:
        run = run_of(row[:width], alias, plain_run)
        schedule = schedule_of(row[width:], alias, plain_schedule) if run.schedule_id is not None else None
        schedule_field.set_cached_value(run, schedule)  # as ``select_related`` leaves it
        out.append(run)
    return out


@cache
def _waiting_sql(vendor: str, queues: int, excluded: int = 0, skipping: bool = False) -> str:
    """The select of the due runs (with their schedules) for a worker of ``queues`` queues (0: any)
    that may not take runs of ``excluded`` tasks, ``skipping`` some ids; on PostgreSQL the runs
    are locked ``FOR UPDATE SKIP LOCKED`` (SQLite's transaction holds the write lock).

    On PostgreSQL the runs are picked (and locked) by a subquery and their schedules joined to
    the picked ones only: joined first, a planner that scans the waiting runs (a small table)
    joined and sorted every one of them with its schedule (6 ms against 1-2 ms at a few thousand
    runs). The locked rows a subquery returns are their latest versions, as a top-level ``FOR
    UPDATE``'s. SQLite walks the claim index and joins each run's schedule as it goes (its
    nested loop stops at the limit), so there the join comes first: no sort at all.

    One queue on SQLite: the due time is written ``+w.available_at`` (no index may use it). Once
    ``ANALYZE`` has run (a database of a million runs), SQLite's statistics show few queues and
    one priority per index prefix, and its planner then preferred a skip-scan of the claim index
    on ``available_at <`` over every queue and priority, reading every due run of every queue and
    sorting them for a limit of 32 (3.5 ms a claim with 45,000 due runs elsewhere, 33 ms in their
    queue). Kept off the index, the due time is a filter of the in-order walk of the queue's
    prefix, which stops at the limit. Several queues (or any) keep the range: their order crosses
    queues, so they sort either way, and the range is the cheaper read there."""
    runs, schedules = _q(Run._meta.db_table), _q(Schedule._meta.db_table)
    # Literals, so that SQLite sees the partial claim index's predicate (see models._literal_states).
    waiting = ", ".join(f"'{s}'" for s in WAITING_STATES)
    due = "+w.available_at" if vendor != "postgresql" and queues == 1 else "w.available_at"
    where = f"w.state IN ({waiting}) AND {due} <= %s"
    if queues:
        where += f" AND w.queue IN ({', '.join(['%s'] * queues)})"
    where += f" AND {not_paused_sql('w.queue')}"
    if excluded:
        where += f" AND w.task_name NOT IN ({', '.join(['%s'] * excluded)})"
    if skipping:
        where += (
            " AND w.id <> ALL(%s)" if vendor == "postgresql" else " AND w.id NOT IN (SELECT value FROM json_each(%s))"
        )
    picked = "w" if vendor != "postgresql" else "c"  # the runs as the outer select names them
    run_cols = ", ".join(f"{picked}.{_q(f.column)}" for f in _columns(Run))
    schedule_cols = ", ".join(f"s.{_q(f.column)}" for f in _columns(Schedule))
    order = "ORDER BY {0}.priority DESC, {0}.available_at, {0}.id"
    if vendor != "postgresql":
        return (
            f"SELECT {run_cols}, {schedule_cols} FROM {runs} AS w LEFT JOIN {schedules} AS s "  # noqa: S608
            f"ON s.id = w.schedule_id WHERE {where} {order.format('w')} LIMIT %s"
        )
    return (
        f"SELECT {run_cols}, {schedule_cols} FROM (SELECT * FROM {runs} AS w WHERE {where} "  # noqa: S608
        f"{order.format('w')} LIMIT %s FOR UPDATE SKIP LOCKED) AS c LEFT JOIN {schedules} AS s "
        f"ON s.id = c.schedule_id {order.format('c')}"
    )


def lock_waiting(
    *, queues: Sequence[str] | None, excluded: Sequence[str], now: datetime, limit: int, skip: Sequence[int] = ()
) -> list[Run]:
    """Up to ``limit`` claimable runs (``Run.objects.claimable``'s rule, in its order) but those in
    ``skip``, with their schedules, locked until COMMIT: the claim's candidates, read by a
    statement written once per shape (through the ORM, building it cost more than running it)."""
    return read_waiting(waiting_statement(queues=queues, excluded=excluded, now=now, limit=limit, skip=skip))


def read_waiting(statement: tuple[str, Sequence[Any]]) -> list[Run]:
    """The runs ``waiting_statement``'s statement reads (and locks)."""
    with connection.cursor() as cursor:
        timestamps.read_natively(cursor)
        cursor.execute(*statement)
        rows = cursor.fetchall()
    return runs_from_rows(rows)


def waiting_statement(
    *, queues: Sequence[str] | None, excluded: Sequence[str], now: datetime, limit: int, skip: Sequence[int] = ()
) -> tuple[str, list[Any]]:
    """``lock_waiting``'s statement and parameters, not run here: PostgreSQL's admission sends it in
    one pipeline with the partition locks it expects to need (``db.admission.pick_and_lock``); its
    rows become runs through ``runs_from_rows``."""
    vendor = connection.vendor
    queues, excluded = list(queues or ()), list(excluded)
    params: list[Any] = [connection.ops.adapt_datetimefield_value(now), *queues, *excluded]
    if skip:
        params.append(list(skip) if vendor == "postgresql" else json.dumps(list(skip)))
    return _waiting_sql(vendor, len(queues), len(excluded), bool(skip)), [*params, limit]


def _claim_sqlite(
    *,
    worker_id: str,
    queues: list[str],
    lease_seconds: float,
    now: datetime,
    limit: int,
    start_all: bool,
    excluded: list[str],
) -> list[Run]:
    expires = now + timedelta(seconds=lease_seconds)
    pk, attempts = _run_column("id"), _run_column("attempts")
    with transaction.atomic():  # BEGIN IMMEDIATE: the write lock
        with connection.cursor() as cursor:
            cursor.execute(*waiting_statement(queues=queues, excluded=excluded, now=now, limit=limit))
            rows = cursor.fetchall()
        if not rows:
            return []
        ids = [row[pk] for row in rows]
        started = len(rows) if start_all else 1
        bulk.execute(_mark_sql("sqlite"), _mark_params(ids, started, worker_id=worker_id, expires=expires, now=now))
        entries = [(row[pk], row[attempts] + 1, EventType.CLAIMED.value) for row in rows]
        entries += [(row[pk], row[attempts] + 1, EventType.STARTED.value) for row in rows[:started]]
        bulk.insert_rows(
            RunEvent,
            {
                "run": [run_id for run_id, _, _ in entries],
                "event_type": [kind for _, _, kind in entries],
                "message": [""] * len(entries),
                "worker_id": [worker_id] * len(entries),
                "attempt": [attempt for _, attempt, _ in entries],
                "created_at": [now] * len(entries),
            },
        )
    # The instances are built after COMMIT: the write lock is held for the SQL only, not for
    # the Python that turns rows into runs (other workers wait on that lock).
    claimed = runs_from_rows(rows)
    _mark_instances(claimed, started=started, worker_id=worker_id, expires=expires, now=now)
    return claimed


@cache
def _run_column(name: str) -> int:
    """The position of the run's column ``name`` in the rows the waiting statement reads."""
    return [f.column for f in _columns(Run)].index(name)


@cache
def _mark_sql(vendor: str) -> str:
    runs = _q(Run._meta.db_table)
    # The ids bound as one array, the text of it (psycopg packs a list element by element in
    # Python); SQLite: one JSON array. One statement text whatever the batch.
    ids = "id = ANY(%s::text::bigint[])" if vendor == "postgresql" else "id IN (SELECT value FROM json_each(%s))"
    return (
        f"UPDATE {runs} SET state = CASE WHEN {ids} THEN '{RunState.RUNNING.value}' "  # noqa: S608
        f"ELSE '{RunState.LEASED.value}' END, lease_owner = %s, lease_expires_at = %s, attempts = attempts + 1, "
        f"started_at = CASE WHEN {ids} THEN %s ELSE started_at END, updated_at = %s, held_by = '' WHERE {ids}"
    )


def mark_statement(
    runs: Sequence[Run], *, started: int, worker_id: str, expires: datetime, now: datetime
) -> bulk.Statement:
    """The claim's one UPDATE of the runs it took (already locked): the first ``started`` of them
    ``running`` (started now), the others ``leased``; each owned by ``worker_id`` until ``expires``
    at its next attempt. As a statement to write along the claim's events (one round trip
    on PostgreSQL, ``events.record_many(along=...)``), not run here. The instances follow now."""
    statement = bulk.Statement(
        _mark_sql(connection.vendor),
        _mark_params([r.pk for r in runs], started, worker_id=worker_id, expires=expires, now=now),
    )
    _mark_instances(runs, started=started, worker_id=worker_id, expires=expires, now=now)
    return statement


@cache
def _marked_events_sql() -> tuple[str, str]:
    """The claim's ``claimed`` and ``started`` events, from the runs its UPDATE (the CTE ``marked``)
    returned, as the one-statement claim's ``logged`` makes them (``write_claim``): the SELECT, and
    the INSERT it follows."""
    events = _q(RunEvent._meta.db_table)
    # In the claim's order (the ids' text bound as an array): as the events built run by run were.
    order = "ORDER BY array_position(%s::text::bigint[], id)"
    return (
        f"SELECT id, '{EventType.CLAIMED.value}', '', %s, attempts, %s FROM "  # noqa: S608 - enum literals
        f"(SELECT id, attempts FROM marked {order}) AS c1 UNION ALL "
        f"SELECT id, '{EventType.STARTED.value}', '', %s, attempts, %s FROM "
        f"(SELECT id, attempts FROM marked WHERE state = '{RunState.RUNNING.value}' {order}) AS c2"
    ), f"INSERT INTO {events} (run_id, event_type, message, worker_id, attempt, created_at) "


def write_claim(
    runs: Sequence[Run],
    *,
    started: int,
    worker_id: str,
    expires: datetime,
    now: datetime,
    prior: bulk.Columns,
    along: Sequence[bulk.Statement] = (),
) -> None:
    """PostgreSQL: the claim's last statement, which also COMMITs (``bulk.execute(last=True)``):
    ``mark_statement``'s UPDATE of the runs it took, the ``along`` statements (the limit holds
    admission took), the ``prior`` events (``RunEvent`` columns: expired leases, runs held back)
    and then the ``claimed`` and ``started`` events of the runs the UPDATE marked, made by the
    statement from what it returned rather than built in Python run by run."""
    marked = mark_statement(runs, started=started, worker_id=worker_id, expires=expires, now=now)
    ctes = [f"marked AS ({marked.sql} RETURNING id, attempts, state)"]
    ctes += [f"along{i} AS ({st.sql})" for i, st in enumerate(along)]
    params = [*marked.params, *chain.from_iterable(st.params for st in along)]
    select, into = _marked_events_sql()
    if any(prior.values()):
        source, bound = bulk.rows_source(RunEvent, prior)
        select = f"SELECT * FROM {source} UNION ALL {select}"  # noqa: S608 - db.bulk's own SQL
        params += bound
    ids = bulk.int_array_text(run.pk for run in runs)
    params += [worker_id, now, ids, worker_id, now, ids]
    bulk.execute(f"WITH {', '.join(ctes)} {into}{select}", params, last=True)


def _mark_params(ids: list[int], started: int, *, worker_id: str, expires: datetime, now: datetime) -> list[Any]:
    """``_mark_sql``'s parameters: the first ``started`` of ``ids`` run, the others are leased."""
    adapt = bulk.datetime_adapter()
    as_array: Callable[[list[int]], Any] = bulk.int_array_text if connection.vendor == "postgresql" else json.dumps
    first = as_array(ids[:started])
    return [first, worker_id, adapt(expires), first, adapt(now), adapt(now), as_array(ids)]


def _mark_instances(runs: Sequence[Run], *, started: int, worker_id: str, expires: datetime, now: datetime) -> None:
    """The instances as the claim's UPDATE left their rows."""
    for i, run in enumerate(runs):
        run.state = RunState.RUNNING if i < started else RunState.LEASED
        run.lease_owner = worker_id
        run.lease_expires_at = expires
        run.attempts += 1
        run.updated_at = now
        run.held_by = ""
        if i < started:
            run.started_at = now


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
    """``claim_runs(include_expired=False)`` in one statement (SQLite: three, prepared once);
    None where neither is written (another vendor: the caller claims through the ORM)."""
    queues = list(queues or ())
    excluded = list(excluded_tasks)
    if connection.vendor == "sqlite":
        return _claim_sqlite(
            worker_id=worker_id,
            queues=queues,
            lease_seconds=lease_seconds,
            now=now,
            limit=limit,
            start_all=start_all,
            excluded=excluded,
        )
    if connection.vendor != "postgresql":
        return None
    params: dict[str, Any] = {
        **{f"q{i}": queue for i, queue in enumerate(queues)},
        **{f"x{i}": task_name for i, task_name in enumerate(excluded)},
        "now": now,
        "limit": limit,
        "started": limit if start_all else 1,
        "owner": worker_id,
        "expires": now + timedelta(seconds=lease_seconds),
    }
    # Its own transaction only: inside a caller's, ``synchronous_commit`` would hold for the caller's writes too.
    durable = bool(conf.SYNCHRONOUS_CLAIMS) or connection.in_atomic_block
    with connection.cursor() as cursor:
        timestamps.read_natively(cursor)
        cursor.execute(_claim_sql(len(queues), len(excluded), durable), params)
        rows = cursor.fetchall()
    return runs_from_rows(rows)
