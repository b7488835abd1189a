# The admin's run list sorted by started (issue 21): the runs that never started sort last in both
# directions, along an index in that order, so a sort by started reads only its page.

import django.db.models.expressions
from django.db import migrations, models

import distsched_app.db.indexes


class Migration(migrations.Migration):
    dependencies = [
        ("distsched_app", "0026_drop_run_idem_index"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="run",
            name="distsched_run_started",
        ),
        migrations.AddIndex(
            model_name="run",
            index=distsched_app.db.indexes.NullsOrderedIndex(
                django.db.models.expressions.OrderBy(models.F("started_at"), descending=True, nulls_last=True),
                django.db.models.expressions.OrderBy(models.F("id"), descending=True),
                name="distsched_run_started_desc",
            ),
        ),
    ]
