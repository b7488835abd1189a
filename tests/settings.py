"""Test settings: the project's, plus a test app that registers test tasks.

The project's production defaults apply (DEBUG off, secure cookies), except the
HTTPS redirect: the test client and the live server speak plain HTTP, and the
test client's host name is allowed also outside pytest (bench/ uses these
settings). ``tests/deployment`` checks the project's own settings in fresh
processes.
"""

import json
import os

from scheduler_project.settings import *  # noqa: F403
from scheduler_project.settings import ALLOWED_HOSTS, DATABASES, INSTALLED_APPS

SECRET_KEY = "tests-only-secret-key-not-for-any-deployment-0123456789abcdefghij"
SECURE_SSL_REDIRECT = False
ALLOWED_HOSTS = [*ALLOWED_HOSTS, "testserver"]
INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
DISTSCHED = {}
# CI's PgBouncer leg: the suite connects through PgBouncer (transaction pooling); the workers' listener
# needs a direct connection (docs/postgresql.md, "Connections and pooling").
if os.environ.get("DISTSCHED_TEST_LISTEN_DATABASE_URL"):
    DISTSCHED["LISTEN_DATABASE_URL"] = os.environ["DISTSCHED_TEST_LISTEN_DATABASE_URL"]
# Real worker processes of the capability tests: their TASK_REQUIRES, as JSON.
if os.environ.get("DISTSCHED_TEST_TASK_REQUIRES"):
    DISTSCHED["TASK_REQUIRES"] = json.loads(os.environ["DISTSCHED_TEST_TASK_REQUIRES"])
# Real worker processes of the flow-control tests (tests/concurrency/test_limits.py) and
# bench/limits.py: their DISTSCHED["LIMITS"], as JSON.
if os.environ.get("DISTSCHED_TEST_LIMITS"):
    DISTSCHED["LIMITS"] = json.loads(os.environ["DISTSCHED_TEST_LIMITS"])
# ... and the cap from which a limit is split over lock stripes (a small one, to make a striped limit bind).
if os.environ.get("DISTSCHED_TEST_LIMIT_STRIPE_MIN_CONCURRENCY"):
    DISTSCHED["LIMIT_STRIPE_MIN_CONCURRENCY"] = int(os.environ["DISTSCHED_TEST_LIMIT_STRIPE_MIN_CONCURRENCY"])
# Real worker processes of the timeout tests (tests/concurrency/test_task_timeout.py): TASK_OPTIONS, as JSON.
if os.environ.get("DISTSCHED_TEST_TASK_OPTIONS"):
    DISTSCHED["TASK_OPTIONS"] = json.loads(os.environ["DISTSCHED_TEST_TASK_OPTIONS"])
# Real ticker processes of the leader tests (tests/concurrency/test_leader.py): a short lease.
if os.environ.get("DISTSCHED_TEST_LEADER_LEASE_SECONDS"):
    DISTSCHED["LEADER_LEASE_SECONDS"] = float(os.environ["DISTSCHED_TEST_LEADER_LEASE_SECONDS"])
if os.environ.get("DISTSCHED_REQUIRE_PGBOUNCER"):
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True  # Django's advice behind PgBouncer
# Ours next to the framework's reference backend, for the conformance tests (any queue name).
# "default" does not retry, like the reference; "retrying" does, quickly.
TASKS = {
    "default": {"BACKEND": "distsched_app.backends.DistschedBackend", "QUEUES": [], "OPTIONS": {"MAX_ATTEMPTS": 1}},
    "retrying": {
        "BACKEND": "distsched_app.backends.DistschedBackend",
        "QUEUES": [],
        "OPTIONS": {"MAX_ATTEMPTS": 3, "RETRY_BASE_SECONDS": 1, "RETRY_MAX_SECONDS": 60},
    },
    "immediate": {"BACKEND": "django_tasks.backends.immediate.ImmediateBackend", "QUEUES": []}
    if __import__("django").VERSION < (6, 0)
    else {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend", "QUEUES": []},
}
