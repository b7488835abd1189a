"""db.timestamps: the claim's cursors read timestamps with psycopg's own loader only where it
gives exactly what Django's gives (PostgreSQL)."""

from __future__ import annotations

from datetime import timezone
from zoneinfo import ZoneInfo

import pytest
from django.db import connection

from distsched_app.db import timestamps

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]

SQL = (
    "SELECT '2026-03-29 01:30:00.123456+00'::timestamptz, '2026-10-25 00:59:59+02'::timestamptz, "
    "NULL::timestamptz, '0001-01-01 00:00:00+00'::timestamptz"
)


def _read(native: bool) -> tuple[list[tuple], type]:
    with connection.cursor() as cursor:
        if native:
            timestamps.read_natively(cursor)
        cursor.execute(SQL)
        rows = cursor.fetchall()
        loader = cursor.cursor.adapters.get_loader(1184, 0)
    return rows, loader


def test_psycopgs_loader_reads_the_same_values_with_the_same_zone_object():
    django_rows, django_loader = _read(native=False)
    native_rows, native_loader = _read(native=True)
    assert native_loader is not django_loader  # the faster loader is in use ...
    assert "psycopg_any" in django_loader.__module__
    assert native_rows == django_rows  # ... and reads the same values
    for django_value, native_value in zip(django_rows[0], native_rows[0], strict=True):
        if django_value is not None:
            assert django_value.tzinfo is timezone.utc and native_value.tzinfo is timezone.utc


def test_a_connection_in_another_zone_keeps_djangos_loader(monkeypatch):
    """``DATABASES[...]["TIME_ZONE"]`` set: Django reads timestamps in that zone; so does the claim."""
    monkeypatch.setattr(connection, "timezone", ZoneInfo("Europe/Paris"))
    with connection.cursor() as cursor:
        before = cursor.cursor.adapters.get_loader(1184, 0)
        timestamps.read_natively(cursor)
        assert cursor.cursor.adapters.get_loader(1184, 0) is before
