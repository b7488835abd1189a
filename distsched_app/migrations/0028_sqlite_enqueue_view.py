# SQLite: one enqueued run and its ``created`` event written by one statement (``db.runs.insert_enqueued``),
# an INSERT into the view ``distsched_enqueue_run`` whose INSTEAD OF trigger inserts the run, then its
# event. One statement is its own transaction outside the caller's: no ``BEGIN IMMEDIATE``, no second
# INSERT, no COMMIT sent from Python (issue 17: 0.146 -> 0.111 ms an enqueue; django-q2's is 0.15).
# PostgreSQL has its function (0025); nothing is created there.
#
# A later migration that makes SQLite rebuild the runs or events table (Django copies it into a new
# table, drops the old one and renames the copy: most AlterField / AddField with a default) fails on
# the rename while this trigger names the table ("error in trigger distsched_enqueue_run_insert: no such
# table"). It must drop the view first and create it again after (DROP and CREATE below), with the
# run's columns as they then are.

from django.db import migrations

VIEW = "distsched_enqueue_run"

# The run's columns as migration 0027 left them, in ``db.runs._ENQUEUE_COLUMNS``'s order, plus the
# event's message. The view has no rows; it only gives the INSERT its columns.
COLUMNS = (
    "id", "task_name", "args", "kwargs", "state", "scheduled_for", "available_at", "attempts", "max_attempts",
    "lease_owner", "last_error", "queue", "origin", "idempotency_key", "cancel_requested", "created_at",
    "updated_at", "priority", "retry_policy", "unique_key", "trace_context", "backend",
)  # fmt: skip

CREATE = [
    f"CREATE VIEW {VIEW} AS SELECT {', '.join(COLUMNS)}, '' AS message FROM distsched_app_run WHERE 0",
    f"CREATE TRIGGER {VIEW}_insert INSTEAD OF INSERT ON {VIEW} BEGIN "
    f"INSERT INTO distsched_app_run ({', '.join(COLUMNS)}) VALUES ({', '.join('NEW.' + c for c in COLUMNS)}); "
    "INSERT INTO distsched_app_runevent (run_id, event_type, message, worker_id, attempt, created_at) "
    "VALUES (NEW.id, 'created', NEW.message, '', 0, NEW.created_at); "
    "END",
]

DROP = [f"DROP TRIGGER IF EXISTS {VIEW}_insert", f"DROP VIEW IF EXISTS {VIEW}"]


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        for sql in CREATE:
            schema_editor.execute(sql)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        for sql in DROP:
            schema_editor.execute(sql)


class Migration(migrations.Migration):
    dependencies = [
        ("distsched_app", "0027_run_started_nulls_last"),
    ]

    # The hint lets a database router keep the view wherever it keeps the runs table.
    operations = [migrations.RunPython(create, drop, hints={"model_name": "run"}, elidable=False)]
