# PostgreSQL: one enqueued run and its ``created`` event written by a PL/pgSQL function
# (``db.runs.insert_enqueued``). The function's two INSERTs are planned once per connection and
# reused, where a statement sent as text is parsed and planned on every call: about 0.1 ms of a
# 0.45 ms enqueue (issue 17). Nothing is created on SQLite.

from django.db import migrations

FUNCTION = "distsched_enqueue_run"

# The run's columns as migration 0023 left them. A later migration that adds a NOT NULL column
# without a database default to the runs table must replace this function too.
CREATE = """
CREATE OR REPLACE FUNCTION {function}(
    p_task_name text, p_args jsonb, p_kwargs jsonb, p_scheduled_for timestamptz, p_max_attempts integer,
    p_queue text, p_now timestamptz, p_priority integer, p_retry_policy jsonb, p_unique_key text,
    p_trace_context jsonb, p_backend text, p_message text, p_channel text
) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    new_id bigint := nextval('{sequence}'::regclass);
BEGIN
    IF p_unique_key = '' THEN
        INSERT INTO distsched_app_run (id, task_name, args, kwargs, state, scheduled_for, available_at, attempts,
            max_attempts, lease_owner, last_error, queue, origin, idempotency_key, cancel_requested, created_at,
            updated_at, priority, retry_policy, unique_key, trace_context, backend)
        VALUES (new_id, p_task_name, p_args, p_kwargs, 'pending', p_scheduled_for, p_scheduled_for, 0,
            p_max_attempts, '', '', p_queue, 'enqueued', 'enqueued:' || new_id, false, p_now, p_now, p_priority,
            p_retry_policy, '', p_trace_context, p_backend);
    ELSE
        -- A duplicate key of an active run of the same task inserts nothing (distsched_run_unique_active_key).
        INSERT INTO distsched_app_run (id, task_name, args, kwargs, state, scheduled_for, available_at, attempts,
            max_attempts, lease_owner, last_error, queue, origin, idempotency_key, cancel_requested, created_at,
            updated_at, priority, retry_policy, unique_key, trace_context, backend)
        VALUES (new_id, p_task_name, p_args, p_kwargs, 'pending', p_scheduled_for, p_scheduled_for, 0,
            p_max_attempts, '', '', p_queue, 'enqueued', 'enqueued:' || new_id, false, p_now, p_now, p_priority,
            p_retry_policy, p_unique_key, p_trace_context, p_backend)
        ON CONFLICT (task_name, unique_key)
            WHERE state IN ('pending', 'leased', 'running', 'retrying', 'blocked') AND NOT (unique_key = '')
            DO NOTHING;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
    END IF;
    INSERT INTO distsched_app_runevent (run_id, event_type, message, worker_id, attempt, created_at)
    VALUES (new_id, 'created', p_message, '', 0, p_now);
    IF p_channel IS NOT NULL THEN
        PERFORM pg_notify(p_channel, p_queue);
    END IF;
    RETURN new_id;
END;
$$
"""

DROP = (
    f"DROP FUNCTION IF EXISTS {FUNCTION}(text, jsonb, jsonb, timestamptz, integer, text, timestamptz, integer, "
    "jsonb, text, jsonb, text, text, text)"
)


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_serial_sequence('distsched_app_run', 'id')")
        sequence = cursor.fetchone()[0]
    schema_editor.execute(CREATE.format(function=FUNCTION, sequence=sequence.replace("'", "''")))


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [
        ("distsched_app", "0024_limithold_stripe"),
    ]

    # The hint lets a database router keep the function wherever it keeps the runs table.
    operations = [migrations.RunPython(create, drop, hints={"model_name": "run"}, elidable=False)]
