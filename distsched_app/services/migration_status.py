"""Is the old queue empty? What a migration from another task queue still has to drain.

``distsched migrate-status --from django-tasks-db`` reads django-tasks-db's table
(``django_tasks_database_dbtaskresult``: tasks READY or RUNNING), ``--from django-q2``
django-q2's ORM broker (``django_q_ormq``: queued tasks, and those a cluster holds,
``lock`` set), directly, with plain SQL: it works whether or not the package is
still installed, as long as its table exists, and says so when it does not (a
django-q2 cluster on Redis or another broker has no table to read). Read-only; one query.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from importlib.util import find_spec

from django.db import connection

from ..errors import ValidationError


@dataclass(frozen=True, kw_only=True)
class Source:
    name: str  # as given to --from
    package: str  # the module the package installs
    table: str
    statuses: tuple[str, ...]  # what is still to run (the old workers' business)
    worker: str  # the old worker command, for the message
    sql: str  # rows (status, count) of what is left; {table} is the quoted table, each %s the time now


SOURCES = {
    "django-tasks-db": Source(
        name="django-tasks-db",
        package="django_tasks_db",
        table="django_tasks_database_dbtaskresult",
        statuses=("READY", "RUNNING"),
        worker="db_worker",
        sql="SELECT status, COUNT(*) FROM {table} WHERE status IN ('READY', 'RUNNING') GROUP BY status",
    ),
    "django-q2": Source(
        name="django-q2",
        package="django_q",
        table="django_q_ormq",
        statuses=("queued", "locked"),
        worker="qcluster",
        # The ORM broker deletes a task's row once a cluster acknowledged it; a cluster that took one
        # moved its "lock" into the future (its timeout): locked until then, queued again after.
        sql="SELECT CASE WHEN lock > %s THEN 'locked' ELSE 'queued' END, COUNT(*) FROM {table} "
        "GROUP BY CASE WHEN lock > %s THEN 'locked' ELSE 'queued' END",
    ),
}


@dataclass(frozen=True, kw_only=True)
class QueueStatus:
    source: str
    table: str
    table_exists: bool
    package_installed: bool
    left: dict[str, int] = field(default_factory=dict)  # status -> tasks still to run

    @property
    def empty(self) -> bool:
        return not any(self.left.values())

    def as_dict(self) -> dict[str, object]:
        return {
            "source": self.source,
            "table": self.table,
            "table_exists": self.table_exists,
            "package_installed": self.package_installed,
            "left": self.left,
            "empty": self.empty,
        }


def old_queue_status(source: str, *, now: datetime) -> QueueStatus:
    """What ``source``'s table still holds to run; a ``ValidationError`` for an unknown source."""
    spec = SOURCES.get(source)
    if spec is None:
        raise ValidationError(f"unknown source {source!r} (known: {', '.join(SOURCES)})", field="from")
    installed = find_spec(spec.package) is not None
    if spec.table not in connection.introspection.table_names():
        return QueueStatus(source=source, table=spec.table, table_exists=False, package_installed=installed)
    with connection.cursor() as cursor:
        moment = connection.ops.adapt_datetimefield_value(now)
        cursor.execute(spec.sql.format(table=connection.ops.quote_name(spec.table)), [moment] * spec.sql.count("%s"))
        counts = dict(cursor.fetchall())
    left = {status: int(counts.get(status, 0)) for status in spec.statuses}
    return QueueStatus(source=source, table=spec.table, table_exists=True, package_installed=installed, left=left)


def describe(status: QueueStatus) -> str:
    """The status in one or two sentences, for the command line."""
    spec = SOURCES[status.source]
    if not status.table_exists:
        return (
            f"{status.source}: no table {status.table} in this database (never migrated, or already removed): "
            "nothing to drain"
        )
    counts = ", ".join(f"{s} {n}" for s, n in status.left.items())
    note = "" if status.package_installed else f" (package {spec.package} is not installed: its table was read)"
    if status.empty:
        return (
            f"{status.source}: the old queue is empty ({counts}){note}: stop its {spec.worker} and remove "
            f"{spec.package} from INSTALLED_APPS"
        )
    return (
        f"{status.source}: {sum(status.left.values())} task(s) left ({counts}){note}: keep its {spec.worker} "
        "running (started with the old settings) until this says empty"
    )
