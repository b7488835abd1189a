"""System checks catch settings that would break the guarantees."""

from __future__ import annotations

from distsched_app.checks import check_distsched_settings


def ids(settings) -> set[str]:
    return {w.id for w in check_distsched_settings(None)}


def test_default_settings_are_clean(settings):
    settings.DISTSCHED = {}
    assert ids(settings) == set()


def test_unknown_setting_is_flagged(settings):
    settings.DISTSCHED = {"LEASE_SECOND": 10}
    assert "distsched.W001" in ids(settings)


def test_sqlite_without_immediate_is_flagged(settings):
    db = dict(settings.DATABASES["default"])
    db["ENGINE"] = "django.db.backends.sqlite3"
    db["OPTIONS"] = {}
    settings.DATABASES = {**settings.DATABASES, "other": db}
    assert "distsched.W002" in ids(settings)


def test_heartbeat_longer_than_half_lease_is_flagged(settings):
    settings.DISTSCHED = {"LEASE_SECONDS": 10, "HEARTBEAT_SECONDS": 6}
    assert "distsched.W003" in ids(settings)
