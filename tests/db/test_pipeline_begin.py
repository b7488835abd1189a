"""The ``BEGIN`` a claim's first pipeline sends itself (``db.admission``) is psycopg's own command:
an isolation level set in the database ``OPTIONS`` (psycopg's ``isolation_level``) still applies
to the transaction it opens (it sent a bare ``BEGIN``)."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from distsched_app.db import admission
from tests.conftest import T0, is_postgres

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_pipelines_begin_keeps_the_connections_isolation_level():
    if not is_postgres():
        pytest.skip("PostgreSQL's pipeline")
    from psycopg import IsolationLevel
    from psycopg.pq import TransactionStatus

    connection.ensure_connection()
    conn = connection.connection
    before = conn.isolation_level
    conn.isolation_level = IsolationLevel.SERIALIZABLE
    try:
        with transaction.atomic():
            assert conn.pgconn.transaction_status == TransactionStatus.IDLE  # the pipeline opens it
            assert admission.begins_transaction()
            admission.lock_and_count("wide", "", T0, timeout_ms=50)
            with connection.cursor() as cursor:
                cursor.execute("SELECT current_setting('transaction_isolation')")
                assert cursor.fetchone() == ("serializable",)
    finally:
        conn.isolation_level = before
