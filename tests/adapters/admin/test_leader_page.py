"""The admin's workers page names the leader and ticks its row."""

from __future__ import annotations

import pytest

from distsched_app.services import workers
from tests.adapters.admin.pages import WORKERS
from tests.adapters.test_leader_surfaces import elect

pytestmark = pytest.mark.django_db


def test_admin_workers_page_names_the_leader(staff, clock):
    workers.register_worker(worker_id="w-lead", hostname="h", pid=1, queues=["default"], now=clock.now())
    body = staff.get(WORKERS).content.decode()
    assert "No leader" in body
    elect("w-lead")
    body = staff.get(WORKERS).content.decode()
    assert "Leader: w-lead (host host-1, pid 4242), term 1." in body
    assert "icon-yes.svg" in body  # the leader column's tick for w-lead
