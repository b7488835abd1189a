"""Shared fixtures: a fake clock, a scheduler bound to it, schedule factories."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone

import pytest
from django.db import connection

from distsched_app import FakeClock, Scheduler
from distsched_app.clock import use_clock
from distsched_app.services import figures
from tests.testapp import tasks as test_tasks

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    """A FakeClock at T0, also installed as the clock every adapter and command reads."""
    with use_clock(FakeClock(T0)) as fake:
        yield fake


@pytest.fixture
def scheduler(clock: FakeClock) -> Scheduler:
    return Scheduler(clock=clock)


@pytest.fixture(autouse=True)
def _reset_test_tasks():
    test_tasks.CALLS.clear()
    test_tasks.HOOKS.clear()
    yield
    test_tasks.CALLS.clear()
    test_tasks.HOOKS.clear()


@pytest.fixture(autouse=True)
def _exact_operator_figures(monkeypatch):
    """No stored figure unless a test asks for one (``figures.SLOW_SECONDS = 0``): a figure is
    stored when computing it was slow, and on a loaded machine that would make a test's counts
    and query numbers depend on its timing."""
    monkeypatch.setattr(figures, "SLOW_SECONDS", float("inf"))


@pytest.fixture
def make_schedule(scheduler: Scheduler):
    """Create a schedule with sensible defaults: ``make_schedule("s1", interval_seconds=60)``."""

    def make(name: str = "s1", task_name: str = "tests.noop", **options):
        if not {"interval_seconds", "cron", "run_at"} & set(options):
            options["interval_seconds"] = 60
        return scheduler.create_schedule(name=name, task_name=task_name, **options)

    return make


def pytest_collection_modifyitems(config, items):
    postgres = connection.settings_dict["ENGINE"].endswith("postgresql")
    skip = pytest.mark.skip(reason="PostgreSQL-only test; DATABASE_URL points at SQLite")
    import os

    pooled = bool(os.environ.get("DISTSCHED_REQUIRE_PGBOUNCER"))
    skip_pooled = pytest.mark.skip(reason="PgBouncer-only test; run by CI's PgBouncer leg")
    # A test whose project keeps its own SQLite file would run the very same thing again.
    own = not postgres or bool(os.environ.get("MIGRATION_TEST_DATABASE_URL"))
    skip_own = pytest.mark.skip(reason="its project runs on a SQLite file of its own: run by the SQLite leg")
    for item in items:
        if "postgres" in item.keywords and not postgres:
            item.add_marker(skip)
        elif "pgbouncer" in item.keywords and not pooled:
            item.add_marker(skip_pooled)
        elif "sqlite_project" in item.keywords and not own:
            item.add_marker(skip_own)


def pytest_sessionstart(session):
    """CI names the database it expects, so a leg can never silently run on the wrong one."""
    import os

    expected = os.environ.get("DISTSCHED_REQUIRE_VENDOR")
    if expected:
        from django.conf import settings

        engine = settings.DATABASES["default"]["ENGINE"]
        if expected not in engine:
            raise pytest.UsageError(f"DISTSCHED_REQUIRE_VENDOR={expected} but the database engine is {engine}")
    if os.environ.get("DISTSCHED_REQUIRE_PGBOUNCER"):
        from django.conf import settings

        port = str(settings.DATABASES["default"].get("PORT"))
        if port != os.environ.get("DISTSCHED_PGBOUNCER_PORT", "6432"):
            raise pytest.UsageError(f"DISTSCHED_REQUIRE_PGBOUNCER is set but the database port is {port}")
