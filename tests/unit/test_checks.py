"""System checks catch settings that would break the guarantees."""

from __future__ import annotations

from distsched_app.checks import check_distsched_settings, sqlite_mode_warnings


def ids(settings) -> set[str]:
    return {w.id for w in check_distsched_settings(None)}


def test_default_settings_are_clean(settings):
    settings.DISTSCHED = {}
    assert ids(settings) == set()


def test_unknown_setting_is_flagged(settings):
    settings.DISTSCHED = {"LEASE_SECOND": 10}
    assert "distsched.W001" in ids(settings)


def test_sqlite_without_immediate_is_flagged():
    databases = {
        "good": {"ENGINE": "django.db.backends.sqlite3", "OPTIONS": {"transaction_mode": "IMMEDIATE"}},
        "bad": {"ENGINE": "django.db.backends.sqlite3", "OPTIONS": {}},
        "pg": {"ENGINE": "django.db.backends.postgresql"},
    }
    warnings = sqlite_mode_warnings(databases)
    assert [w.id for w in warnings] == ["distsched.W002"] and "'bad'" in warnings[0].msg


def test_heartbeat_longer_than_half_lease_is_flagged(settings):
    settings.DISTSCHED = {"LEASE_SECONDS": 10, "HEARTBEAT_SECONDS": 6}
    assert "distsched.W003" in ids(settings)
