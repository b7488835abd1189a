"""The test settings plus both task backends' apps; ``BENCH_TASKS_SYSTEM`` picks ``TASKS``.

Both systems share these settings (same database, same installed apps), so the
one difference between a distsched run and a django-tasks-db run is the
``BACKEND`` string. Without ``BENCH_TASKS_SYSTEM`` (the benchmark's own
process, which never enqueues) the framework's dummy backend is configured.
"""

import os

import django

from tests.settings import *  # noqa: F403
from tests.settings import DISTSCHED, INSTALLED_APPS
from tests.settings import TASKS as TEST_TASKS

DJANGO6 = django.VERSION >= (6, 0)
BACKENDS = {
    "distsched": "distsched_app.backends.DistschedBackend",
    "peer": "django_tasks_db.DatabaseBackend",
    "": ("django.tasks" if DJANGO6 else "django_tasks") + ".backends.dummy.DummyBackend",
}

INSTALLED_APPS = [
    *INSTALLED_APPS,
    *([] if DJANGO6 or "django_tasks" in INSTALLED_APPS else ["django_tasks"]),  # the backport is an app
    "django_tasks_db",
    "bench_tasks.apps.BenchTasksConfig",
]
TASKS = {
    **TEST_TASKS,  # the test app's tasks name some of these aliases
    "default": {
        "BACKEND": BACKENDS[os.environ.get("BENCH_TASKS_SYSTEM", "")],
        "QUEUES": [],  # any queue: the test app's tasks (imported by both systems) use several
        "OPTIONS": {},  # HOOK: distsched backend options, if the benchmark should set any
    },
    # bench/latency.py enqueues to both systems from one process, by alias.
    "distsched": {"BACKEND": BACKENDS["distsched"], "QUEUES": []},
    "peer": {"BACKEND": BACKENDS["peer"], "QUEUES": []},
}
if os.environ.get("BENCH_DISTSCHED_LISTEN") == "0":  # bench/latency.py: an idle worker without LISTEN
    DISTSCHED = {**DISTSCHED, "LISTEN": False}
if os.environ.get("BENCH_DISTSCHED_SYNCHRONOUS_CLAIMS") == "0":  # claims that commit without waiting for the disk
    DISTSCHED = {**DISTSCHED, "SYNCHRONOUS_CLAIMS": False}
if os.environ.get("BENCH_PROCRASTINATE"):  # bench/latency.py on PostgreSQL: procrastinate side by side
    INSTALLED_APPS = [*INSTALLED_APPS, "procrastinate.contrib.django"]
    PROCRASTINATE_AUTODISCOVER_MODULE_NAME = "procrastinate_tasks"
