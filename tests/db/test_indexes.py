"""``db.indexes.NullsOrderedIndex``: one index definition, spelled for each database."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.models import F

from distsched_app.db.indexes import NullsOrderedIndex
from distsched_app.models import Run

pytestmark = pytest.mark.django_db


def ddl(index: NullsOrderedIndex) -> str:
    editor = connection.schema_editor(collect_sql=True)  # not entered: only its SQL is wanted
    return str(index.create_sql(Run, editor))


def test_the_runs_started_index_keeps_its_nulls_order_where_the_database_can_say_it():
    [index] = [i for i in Run._meta.indexes if i.name == "distsched_run_started_desc"]
    sql = ddl(index)
    if connection.vendor == "postgresql":
        assert '"started_at" DESC NULLS LAST, "id" DESC' in sql
    else:  # SQLite: DESC already puts NULLs last, and CREATE INDEX rejects the modifier
        assert '"started_at" DESC, "id" DESC' in sql and "NULLS" not in sql


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite only: PostgreSQL can index any NULLs order")
def test_an_order_sqlite_cannot_index_is_refused_there():
    with pytest.raises(ValueError, match="SQLite cannot index"):
        ddl(NullsOrderedIndex(F("started_at").desc(nulls_first=True), name="x_started"))
