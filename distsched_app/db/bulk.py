"""Bulk statements: insert rows and update from rows, one implementation per vendor.

The tick and the worker write thousands of rows a second. ``bulk_create``
and ORM ``Case`` updates build a model instance or an expression per row,
which cost more than the statements themselves, so these take plain tuples.
A call site names model fields; columns and their types come from the fields.

The rows reach the database as one FROM item (``rows_source``), written once
per vendor:

- PostgreSQL: one array per column, ``unnest(...)``, bound on the server
  (``server_side_execute``): a handful of parameters whatever the number of rows, and
  psycopg packs each array in binary instead of Django formatting every
  element in Python. One statement per call. psycopg packs a list element by element in
  Python (about 0.6 µs each), so a column whose rows all hold one value (a batch's time,
  worker, event type) is bound as that one value, and a column of integers (run ids) as the
  text of its array (``_pg_column``).
- SQLite: a ``VALUES`` list, one parameter per value,
  ``ROWS_PER_STATEMENT`` rows per statement (the one chunk-size rule).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cache
from itertools import chain
from typing import Any, cast

from django.conf import settings
from django.db import connection
from django.db.models import Field, Model

ROWS_PER_STATEMENT = 500
"""Rows per statement where each value is its own parameter (not PostgreSQL): at six
columns 3,000 parameters, well under SQLite's limit of 32,766 (SQLite >= 3.32)."""


@dataclass(frozen=True)
class Bind:
    """One value bound once per statement, not per row (``insert_rows(select=...)``)."""

    value: Any


@dataclass(frozen=True)
class Statement:
    """A data-modifying statement and its parameters, written along an insert
    (``insert_rows(along=...)``): on PostgreSQL a CTE of the same statement (one round trip for
    both), elsewhere run before it."""

    sql: str
    params: list[Any]


def _vendor_is_postgresql() -> bool:
    return connection.vendor == "postgresql"


def table(model: type[Model]) -> str:
    """The model's quoted table name, for a JOIN in ``insert_rows``."""
    return connection.ops.quote_name(model._meta.db_table)


def _field(model: type[Model], name: str) -> Field:
    """A concrete column of the model (bulk statements name no relations or generic keys)."""
    return cast(Field, model._meta.get_field(name))


def _fields(model: type[Model], names: Sequence[str]) -> list[Field]:
    return [_field(model, name) for name in names]


@cache
def _array_type(field: Field) -> str:
    """The element type of a column's array, without a length: ``varchar(10)`` -> ``varchar``
    (a cast to ``varchar(10)[]`` would silently truncate, where the insert refuses). Once per
    field (a process talks to one database): every bulk statement of the hot path asks."""
    return re.sub(r"\(.*?\)", "", field.cast_db_type(connection))  # type: ignore[attr-defined]  # not in the stubs


def _adapter(field: Field) -> Callable[[Any], Any] | None:
    """How one value of ``field`` is passed as a parameter on the ``VALUES`` path
    (datetimes as Django's text; everything else as is)."""
    if field.get_internal_type() == "DateTimeField":
        return datetime_adapter()
    return None


def datetime_adapter() -> Callable[[Any], Any]:
    """``connection.ops.adapt_datetimefield_value``, with a short cut on SQLite (``USE_TZ``, the
    connection in UTC) for a datetime in UTC: the text Django writes for it (its naive UTC time)
    without Django's general path (which asks the settings and converts the zone per value).
    The worker adapts a few datetimes per run (start, finish, each event's time)."""
    adapt = connection.ops.adapt_datetimefield_value
    if connection.vendor != "sqlite" or not settings.USE_TZ or connection.timezone_name != "UTC":
        return adapt

    def utc(value: Any) -> Any:
        if type(value) is datetime and value.tzinfo is timezone.utc:
            return str(value)[:-6]  # its text but the "+00:00"
        return adapt(value)

    return utc


Columns = Mapping[str, Sequence[Any]]
"""Rows given column by column: field name -> one value per row (every column as long).
Not a tuple per row: PostgreSQL binds each column as it is, and 10,000 row tuples
held at once cost the tick a garbage-collector pass over everything it holds."""


def _length(columns: Columns) -> int:
    lengths = {len(values) for values in columns.values()}
    if len(lengths) != 1:
        # unnest() would pad the short arrays with NULLs instead of failing.
        raise ValueError(f"columns of different lengths: { {name: len(v) for name, v in columns.items()} }")
    return lengths.pop()


def _chunks(columns: Columns) -> Iterator[Columns]:
    if _vendor_is_postgresql():
        yield columns  # whole arrays: one statement
        return
    n = _length(columns)
    for start in range(0, n, ROWS_PER_STATEMENT):
        yield {name: values[start : start + ROWS_PER_STATEMENT] for name, values in columns.items()}


@cache
def _quoted(field: Field) -> str:
    """A column name as SQL (``LimitHold``'s ``limit`` and ``key`` are reserved words), once per field."""
    return connection.ops.quote_name(field.column)


def rows_source(
    model: type[Model],
    columns: Columns,
    *,
    alias: str = "u",
    ordinal: str | None = None,
) -> tuple[str, list[Any]]:
    """One or more rows of ``model``'s fields (``columns``) as a FROM item ``alias`` whose
    columns are the fields' column names, plus ``ordinal`` (the row's position) if named.

    Returns the SQL and its parameters. Datetimes are aware; the caller chunks
    (``insert_rows`` and ``update_from_rows`` do: ``ROWS_PER_STATEMENT``).
    """
    n = _length(columns)
    model_fields = _fields(model, list(columns))
    names = [_quoted(f) for f in model_fields]
    if _vendor_is_postgresql():
        arrays, params = [], []
        for field, values in zip(model_fields, columns.values(), strict=True):
            sql, bound = _pg_column(_array_type(field), values if isinstance(values, list) else list(values))
            arrays.append(sql)
            params += bound
        aliases = ", ".join([*names, *([ordinal] if ordinal else [])])
        ordinality = " WITH ORDINALITY" if ordinal else ""
        return f"unnest({', '.join(arrays)}){ordinality} AS {alias}({aliases})", params
    width = len(names) + (1 if ordinal else 0)
    selected = [f"column{i + 1} AS {name}" for i, name in enumerate(names)]
    if ordinal:
        selected.append(f"column{width} AS {ordinal}")
    values = ", ".join([f"({', '.join(['%s'] * width)})"] * n)
    sql = f"(SELECT {', '.join(selected)} FROM (VALUES {values})) AS {alias}"
    return sql, _values_params(model_fields, columns, ordinal=bool(ordinal))


def _pg_column(element: str, values: list[Any]) -> tuple[str, list[Any]]:
    """One column of ``rows_source`` on PostgreSQL: an array expression of ``element`` values and
    its parameters. The same value in every row (not NULL): that value, repeated by the server
    (``array_fill``). Integers (not bools): the array's text, ``{1,2,3}``, made by ``str.join``.
    Anything else: the list, which psycopg packs in binary."""
    n = len(values)
    first = values[0] if n else None
    # ``count`` compares with ==, which holds between 1 and True: the type check keeps such a column a list.
    if n > 1 and first is not None and values.count(first) == n and type(first) is type(values[-1]):
        return f"array_fill(%b::{element}, ARRAY[%b::int])", [first, n]
    if n and all(type(v) is int for v in values):
        return f"%b::text::{element}[]", [int_array_text(values)]
    return f"%b::{element}[]", [values]


def int_array_text(values: Iterable[int]) -> str:
    """PostgreSQL: the text of an array of integers (``{1,2,3}``), for a statement to cast
    (``%s::text::bigint[]``): psycopg packs a list element by element in Python."""
    return "{" + ",".join(map(str, values)) + "}"


def _memoized(adapt: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``adapt`` computed once per distinct value: a tick's rows share ``now`` (created, updated,
    the event's time) and each row's slot is also its ``available_at``."""
    seen: dict[Any, Any] = {}

    def adapted(value: Any) -> Any:
        try:
            return seen[value]
        except KeyError:
            seen[value] = out = adapt(value)
            return out

    return adapted


def _values_params(model_fields: list[Field], columns: Columns, *, ordinal: bool = False) -> list[Any]:
    """The values row after row, adapted column by column (``map``: no generator per row)."""
    adapted: list[Iterable[Any]] = []
    memo: dict[Callable[[Any], Any], Callable[[Any], Any]] = {}
    for field, values in zip(model_fields, columns.values(), strict=True):
        adapt = _adapter(field)
        if adapt is not None:
            adapt = memo.setdefault(adapt, _memoized(adapt))
        adapted.append(values if adapt is None else map(adapt, values))
    if ordinal:
        adapted.append(range(_length(columns)))
    return list(chain.from_iterable(zip(*adapted, strict=True)))


def execute(sql: str, params: Sequence[Any], *, last: bool = False) -> list[tuple]:
    """Run one statement on the default connection; return its rows, if any.

    PostgreSQL: through ``server_side_execute`` (arrays bound by the server). ``last``: the
    caller's last statement in its transaction (see ``server_side_execute``).
    """
    if _vendor_is_postgresql():
        return server_side_execute(sql, params, last=last)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def commits_early() -> bool:
    """Whether a ``last`` statement may carry the COMMIT (``server_side_execute``): PostgreSQL,
    directly inside an outermost ``transaction.atomic()`` that will commit (no savepoint, no
    rollback pending). Inside any other block (a caller's transaction, a test's) it may not."""
    return (
        _vendor_is_postgresql()
        and connection.in_atomic_block
        and connection.commit_on_exit
        and len(connection.atomic_blocks) == 1
        and not connection.savepoint_ids
        and not connection.needs_rollback
    )


def server_side_execute(sql: str, params: Sequence[Any], *, last: bool = False) -> list[tuple]:
    """PostgreSQL: one statement through a server-side-binding psycopg cursor on Django's
    connection (so in its transaction), with Django's error types (IntegrityError, ...).

    Django's psycopg backend binds on the client, formatting each array element
    in Python; for these statements that cost more than the database's own work.

    ``last``: the caller's last statement in its transaction, after which its ``atomic()``
    block ends. Where that block is the outermost (``commits_early``), the COMMIT is sent in
    the same round trip as the statement (psycopg's pipeline mode) instead of one of its own:
    Django's commit at the block's end then finds nothing left to commit (psycopg sends none
    for an idle connection) and runs its ``on_commit`` callbacks as usual. If the statement
    fails, the COMMIT is not run: the transaction is in error and the block rolls it back, as
    for any failed statement; if the COMMIT fails, the server has rolled back and the block's
    rollback finds nothing to undo. A claim is written this way (``claiming.claim_runs``).
    """
    import psycopg

    connection.ensure_connection()
    conn = connection.connection
    with connection.wrap_database_errors, psycopg.Cursor(conn) as cursor:
        if last and commits_early():
            # Both sent at the pipeline's end, one sync (``conn.commit()`` would sync twice).
            with psycopg.Cursor(conn) as control, conn.pipeline():
                cursor.execute(sql, params)
                control.execute("COMMIT")
        else:
            cursor.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def insert_rows(
    model: type[Model],
    columns: Columns,
    *,
    select: Mapping[str, str | Bind] | None = None,
    join: str = "",
    ordered: bool = False,
    returning: Sequence[str] = (),
    along: Sequence[Statement] = (),
    last: bool = False,
) -> list[tuple]:
    """Insert rows, given column by column (field name -> values), into ``model``'s table.

    Without ``select`` each row is inserted as it is. With it, ``select`` maps
    every inserted field to an SQL expression over the rows (``u.<column>``)
    and ``join`` (say ``f"JOIN {table(Schedule)} s ON s.id = u.schedule_id"``),
    or to a ``Bind`` value. ``ordered`` inserts in the order of the rows (ids
    follow it). ``returning`` fields are read back (datetimes aware, in UTC);
    their order is the database's, not the rows'. ``along``: data-modifying statements written
    with the insert (``Statement``), in one round trip on PostgreSQL. ``last``: the caller's
    last statement in its transaction (``execute``).
    """
    if not _length(columns):
        run_all(along)
        return []
    if along and not _vendor_is_postgresql():
        run_all(along)
        along = ()
    into = f"INSERT INTO {table(model)}"
    plain = select is None and not join and not ordered  # each row as it is: the simplest statement
    if select is None:
        select = {name: f"u.{_quoted(_field(model, name))}" for name in columns}
    target = ", ".join(_quoted(f) for f in _fields(model, list(select)))
    # Bound values first: they come before the row source in the statement.
    binds = [
        _field(model, name).get_db_prep_value(value.value, connection)
        for name, value in select.items()
        if isinstance(value, Bind)
    ]
    expressions = ", ".join("%s" if isinstance(value, Bind) else value for value in select.values())
    order = " ORDER BY u.ord" if ordered else ""
    tail = " RETURNING " + ", ".join(_quoted(f) for f in _fields(model, returning)) if returning else ""
    returned: list[tuple] = []
    chunks = list(_chunks(columns))
    for n, chunk in enumerate(chunks, start=1):
        if plain and not _vendor_is_postgresql():
            row = f"({', '.join(['%s'] * len(chunk))})"
            sql = f"{into} ({target}) VALUES {', '.join([row] * _length(chunk))}{tail}"
            params = _values_params(_fields(model, list(chunk)), chunk)
        elif plain:
            source, params = rows_source(model, chunk)
            sql = f"{into} ({target}) SELECT * FROM {source}{tail}"
        else:
            source, params = rows_source(model, chunk, ordinal="ord" if ordered else None)
            sql = f"{into} ({target}) SELECT {expressions} FROM {source} {join}{order}{tail}"
            params = [*binds, *params]
        if along:  # PostgreSQL (one chunk): the statements as CTEs of this one
            ctes = ", ".join(f"along{i} AS ({st.sql})" for i, st in enumerate(along))
            sql, params = f"WITH {ctes} {sql}", [*chain.from_iterable(st.params for st in along), *params]
        returned.extend(execute(sql, params, last=last and n == len(chunks)))
    if returned and not _vendor_is_postgresql():
        kinds = [f.get_internal_type() for f in _fields(model, returning)]
        if "DateTimeField" in kinds:
            by_column = zip(*returned, strict=True)
            converted = [map(_aware, c) if k == "DateTimeField" else c for k, c in zip(kinds, by_column, strict=True)]
            returned = list(zip(*converted, strict=True))
    return returned


def run_all(statements: Sequence[Statement]) -> None:
    """Run the statements one by one (``execute``)."""
    for statement in statements:
        execute(statement.sql, statement.params)


def insert_statements(model: type[Model], columns: Columns) -> list[Statement]:
    """``insert_rows``' plain insert of these rows as statements to write along another one
    (``along``), not run here: one on PostgreSQL, one per ``ROWS_PER_STATEMENT`` rows elsewhere."""
    into = f"INSERT INTO {table(model)} ({', '.join(_quoted(f) for f in _fields(model, list(columns)))})"
    out = []
    for chunk in _chunks(columns) if _length(columns) else ():
        if _vendor_is_postgresql():
            source, params = rows_source(model, chunk)
            out.append(Statement(f"{into} SELECT * FROM {source}", params))
        else:
            values = ", ".join([f"({', '.join(['%s'] * len(chunk))})"] * _length(chunk))
            out.append(Statement(f"{into} VALUES {values}", _values_params(_fields(model, list(chunk)), chunk)))
    return out


def _aware(value: datetime | str | None) -> datetime | None:
    """A timestamp as SQLite returns it (text or naive, in UTC) -> aware UTC."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


def update_from_rows(model: type[Model], key: str, columns: Columns) -> None:
    """``UPDATE ... SET field = u.field ... FROM <rows> WHERE key = u.key``: one statement
    (per chunk) for many rows instead of a CASE per row. ``columns`` holds ``key`` and
    the fields to set, column by column."""
    run_all(update_statements(model, key, columns))


def update_statements(model: type[Model], key: str, columns: Columns) -> list[Statement]:
    """``update_from_rows``' statements, not run here (to be written along another one)."""
    if not _length(columns):
        return []
    table_sql = table(model)
    key_column = _quoted(_field(model, key))
    sets = ", ".join(
        f"{_quoted(f)} = u.{_quoted(f)}" for f in _fields(model, [name for name in columns if name != key])
    )
    out = []
    for chunk in _chunks(columns):
        source, params = rows_source(model, chunk)
        sql = f"UPDATE {table_sql} SET {sets} FROM {source} WHERE {table_sql}.{key_column} = u.{key_column}"
        out.append(Statement(sql, params))
    return out
