"""``bench/peers.py``'s settings: ``bench_tasks.settings`` plus django-q2 (and procrastinate on PostgreSQL).

Every system of the benchmark runs on these settings, so they share the database
and its tuning (SQLite WAL, ``synchronous=NORMAL``, ``BEGIN IMMEDIATE``).
``BENCH_TASKS_SYSTEM`` still picks ``TASKS["default"]`` (the ``django.tasks`` leg);
``BENCH_Q_WORKERS`` is the size of django-q2's worker pool.

``CONN_MAX_AGE`` is ``$BENCH_CONN_MAX_AGE`` (``none``: persistent connections, the
benchmark's default; the project's settings have 0). django-q2 calls
``close_old_connections()`` on every enqueue, dequeue, task and result save, so under
``CONN_MAX_AGE=0`` it reconnects about twice per job on each side; distsched and
procrastinate keep their connections either way.

django-q2 (``Q_CLUSTER``): the ORM broker on ``default``; ``save_limit: 0`` keeps every
success (its default, 250, prunes them, which would leave nothing to count);
``max_attempts: 1`` and a ``retry`` of an hour, so no task is delivered a second time
during a leg (a redelivery of a task that already succeeded would not show in its
``Task`` row); ``poll: 0.05`` (its default is 0.2 s; the broker sleeps that long only
when the queue is empty), as distsched's workers get ``--poll-interval 0.05``.
Everything else is django-q2's default (``bulk`` 1, ``recycle`` 500, ``queue_limit``
workers², ``guard_cycle`` 0.5 s).
"""

import os

from bench_tasks.settings import *  # noqa: F403
from bench_tasks.settings import DATABASES, INSTALLED_APPS

_age = os.environ.get("BENCH_CONN_MAX_AGE", "none")
DATABASES["default"]["CONN_MAX_AGE"] = None if _age.lower() == "none" else int(_age)
INSTALLED_APPS = [*INSTALLED_APPS, "django_q"]
Q_CLUSTER = {
    "name": "bench",
    "orm": "default",
    "workers": int(os.environ.get("BENCH_Q_WORKERS", "1")),
    "save_limit": 0,
    "max_attempts": 1,
    "ack_failures": True,
    "timeout": 1800,
    "retry": 3600,
    "poll": 0.05,
    "catch_up": False,
    "log_level": "WARNING",
}
if DATABASES["default"]["ENGINE"].endswith("postgresql") and "procrastinate.contrib.django" not in INSTALLED_APPS:
    INSTALLED_APPS = [*INSTALLED_APPS, "procrastinate.contrib.django"]  # PostgreSQL only
    PROCRASTINATE_AUTODISCOVER_MODULE_NAME = "procrastinate_tasks"
