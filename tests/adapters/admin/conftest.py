"""The admin tests' client: a superuser's, on the suite's FakeClock."""

from __future__ import annotations

import pytest


@pytest.fixture
def staff(admin_client, clock, monkeypatch):
    """A superuser's client; the admin reads the same FakeClock as the services."""
    return admin_client
