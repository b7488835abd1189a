"""``distsched migrate-status``: honest when the old queue's table does not exist."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("source", "table"), [("django-tasks-db", "django_tasks_database_dbtaskresult"), ("django-q2", "django_q_ormq")]
)
def test_without_the_old_table_there_is_nothing_to_drain(source, table):
    out = StringIO()
    call_command("distsched", "migrate-status", "--from", source, stdout=out)
    assert out.getvalue().strip() == (
        f"{source}: no table {table} in this database (never migrated, or already removed): nothing to drain"
    )
    out = StringIO()
    call_command("distsched", "migrate-status", "--from", source, "--json", stdout=out)
    document = json.loads(out.getvalue())
    assert (document["table_exists"], document["left"], document["empty"]) == (False, {}, True)
