# The run list sorted by scheduled for / started (admin), and the kwargs search's time bound.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("distsched_app", "0017_workflows"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="run",
            index=models.Index(fields=["scheduled_for", "id"], name="distsched_run_sched_for"),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(fields=["started_at", "id"], name="distsched_run_started"),
        ),
    ]
