"""Delete a batch of runs with everything that points at them, in one PostgreSQL statement.

Django's delete collector spends a round trip per related table on every batch (select the
ids, delete the events, then each table holding a foreign key to runs, then the runs in
chunks): about 150 ms per 1,000 runs with their 3,000 events at ten million runs. Prune and
retention do this all day, so on PostgreSQL the batch is one statement: the locked runs in a
materialized CTE, one data-modifying CTE per referencing table (``CASCADE``: delete,
``SET_NULL``: clear the column), then the runs. The referencing tables are read from the
models, not listed by hand, so a new foreign key to runs is covered; one whose rule is not
a plain ``CASCADE``/``SET_NULL``/``DO_NOTHING``, or whose own rows are referenced in turn,
makes :func:`statement` answer ``None`` and the caller keeps the collector (as it does when
someone listens for ``pre_delete``/``post_delete`` of these models). Foreign keys are
deferred (Django creates them ``DEFERRABLE INITIALLY DEFERRED``), so the order of the
sub-statements does not matter; they are checked at COMMIT.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from functools import cache
from typing import Any

from django.db import connection, models
from django.db.models import ForeignObjectRel, QuerySet
from django.db.models.signals import post_delete, pre_delete

from ..models import Run, RunEvent


@cache
def _dependents() -> tuple[tuple[str, tuple[str, ...], bool], ...] | None:
    """(table, its columns pointing at runs, delete rather than clear) for every referencing
    table, or None when one of them needs the collector."""
    by_table: dict[tuple[str, bool], list[str]] = defaultdict(list)
    for rel in Run._meta.get_fields(include_hidden=True):
        if not isinstance(rel, ForeignObjectRel):
            continue  # Run's own columns and forward keys
        model = rel.related_model
        if rel.many_to_many or not isinstance(model, type):
            return None
        if rel.on_delete is models.DO_NOTHING:
            continue
        if rel.on_delete is models.CASCADE:
            if any(isinstance(f, ForeignObjectRel) for f in model._meta.get_fields(include_hidden=True)):
                return None  # its rows are referenced too: a cascade of a cascade
            by_table[(model._meta.db_table, True)].append(rel.field.column)
        elif rel.on_delete is models.SET_NULL:
            by_table[(model._meta.db_table, False)].append(rel.field.column)
        else:
            return None  # PROTECT, RESTRICT, SET_DEFAULT, SET(...): the collector's rules
    return tuple((table, tuple(columns), delete) for (table, delete), columns in by_table.items())


def _listened() -> bool:
    """Someone listens for deletes of runs or what points at them: their receivers are owed the
    collector's ``pre_delete``/``post_delete`` calls (Django's own fast delete steps aside too)."""
    rels = [rel for rel in Run._meta.get_fields(include_hidden=True) if isinstance(rel, ForeignObjectRel)]
    senders = [Run, *(rel.related_model for rel in rels)]
    return any(signal.has_listeners(sender) for signal in (pre_delete, post_delete) for sender in senders)


def statement(locked: QuerySet[Any, Any]) -> tuple[str, list[Any]] | None:
    """The one statement that deletes the runs ``locked`` selects (a ``values_list("pk",
    "finished_at")`` sliced and locked ``FOR UPDATE SKIP LOCKED``) with their dependents.

    It returns one row: (runs deleted, events deleted, the latest ``finished_at`` deleted).
    None off PostgreSQL, or when a referencing table needs Django's collector."""
    dependents = _dependents()
    if connection.vendor != "postgresql" or dependents is None or _listened():
        return None
    q = connection.ops.quote_name
    select, params = locked.query.sql_with_params()
    ids = "(SELECT pk FROM doomed)"
    parts = [f"doomed AS MATERIALIZED ({select})"]
    events = None
    for n, (table, columns, delete) in enumerate(dependents):
        where = " OR ".join(f"{q(column)} IN {ids}" for column in columns)
        if delete:
            counted = table == RunEvent._meta.db_table
            events = f"d{n}" if counted else events
            returning = " RETURNING 1" if counted else ""
            parts.append(f"d{n} AS (DELETE FROM {q(table)} WHERE {where}{returning})")  # noqa: S608 - names only
        else:
            sets = ", ".join(f"{q(column)} = NULL" for column in columns)
            parts.append(f"d{n} AS (UPDATE {q(table)} SET {sets} WHERE {where})")  # noqa: S608 - names only
    runs, pk = q(Run._meta.db_table), q(Run._meta.pk.column)
    parts.append(f"gone AS (DELETE FROM {runs} WHERE {pk} IN {ids} RETURNING finished_at)")  # noqa: S608 - names only
    counted_events = f"(SELECT count(*) FROM {events})" if events else "0"  # noqa: S608 - a CTE's name
    sql = (
        f"WITH {', '.join(parts)} "  # noqa: S608 - table and column names only
        f"SELECT (SELECT count(*) FROM gone), {counted_events}, (SELECT max(finished_at) FROM gone)"
    )
    return sql, list(params)


def run(sql: str, params: list[Any]) -> tuple[int, int, datetime | None]:
    """Execute :func:`statement`'s SQL: (runs, events, latest ``finished_at``) deleted."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        runs, events, latest = cursor.fetchone()
    return int(runs), int(events), latest
