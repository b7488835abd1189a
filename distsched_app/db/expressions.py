"""SQL functions whose SQLite form differs: computed in the database's C, not per row in Python.

Django's SQLite backend implements datetime arithmetic and truncation with
Python functions it registers on the connection, called once per row; over a
day of runs or events that cost tenths of a second per query. Timestamps are
stored in UTC as 'YYYY-MM-DD HH:MM:SS[.ffffff]', so SQLite's own ``strftime``
and string functions give the same answers. PostgreSQL keeps its native SQL.
"""

from __future__ import annotations

from datetime import timezone

from django.db.models import BigIntegerField, Func
from django.db.models.functions import TruncHour


class Microseconds(Func):
    """``end - start`` in whole microseconds, computed by the database itself.

    Django's own datetime arithmetic on SQLite calls a Python function per row
    (``django_timestamp_diff``), which cost ~0.5 s over a day of finished runs;
    this is C (``strftime``) on SQLite and ``EXTRACT(EPOCH ...)`` on PostgreSQL,
    and stays exact to the microsecond, so histogram bucket edges are compared exactly.
    """

    output_field = BigIntegerField()
    arity = 2

    def as_sql(self, compiler, connection, function=None, template=None, arg_joiner=None, **extra):  # PostgreSQL
        return super().as_sql(
            compiler,
            connection,
            function=function,
            template="(EXTRACT(EPOCH FROM (%(expressions)s)) * 1000000)::bigint",
            arg_joiner=" - ",
            **extra,
        )

    def as_sqlite(self, compiler, connection, **extra):
        # Django stores 'YYYY-MM-DD HH:MM:SS[.ffffff]' (UTC): whole seconds, then the 6-digit fraction.
        (end, end_params), (start, start_params) = (compiler.compile(e) for e in self.get_source_expressions())
        sql = (
            f"((CAST(strftime('%%s', {end}) AS INTEGER) - CAST(strftime('%%s', {start}) AS INTEGER)) * 1000000"
            f" + CAST(substr({end}, 21, 6) AS INTEGER) - CAST(substr({start}, 21, 6) AS INTEGER))"
        )
        return sql, (*end_params, *end_params, *start_params, *start_params)


class UTCHour(TruncHour):
    """``TruncHour`` in UTC, computed by SQLite's C ``strftime`` instead of Django's per-row Python function.

    Django's SQLite ``TruncHour`` calls back into Python for every event row
    (~0.3 s over a day of events at a million runs); timestamps are stored in
    UTC as 'YYYY-MM-DD HH:MM:SS[.ffffff]', so the hour is a string operation.
    PostgreSQL keeps Django's ``date_trunc``.
    """

    def __init__(self, expression: str) -> None:
        super().__init__(expression, tzinfo=timezone.utc)

    def as_sqlite(self, compiler, connection, **extra):
        sql, params = compiler.compile(self.lhs)
        return f"strftime('%%Y-%%m-%%d %%H:00:00', {sql})", params
