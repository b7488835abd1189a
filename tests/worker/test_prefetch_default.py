"""The worker's batch size when neither ``--prefetch`` nor ``PREFETCH`` says: 128 on SQLite
(each transaction there writes whole pages), ``PREFETCH``'s 32 elsewhere."""

from __future__ import annotations

import pytest
from django.db import connection

from distsched_app.worker import SQLITE_PREFETCH, Worker

pytestmark = pytest.mark.django_db


def test_unset_the_batch_is_sqlites_own_or_prefetchs_default(settings):
    settings.DISTSCHED = {k: v for k, v in settings.DISTSCHED.items() if k != "PREFETCH"}
    assert Worker(worker_id="w").prefetch == (SQLITE_PREFETCH if connection.vendor == "sqlite" else 32)


def test_the_setting_and_the_option_win_on_every_database(settings):
    settings.DISTSCHED = {**settings.DISTSCHED, "PREFETCH": 16}
    assert Worker(worker_id="w").prefetch == 16
    assert Worker(worker_id="w", prefetch=8).prefetch == 8
