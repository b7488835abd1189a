"""System checks catch settings that would break the guarantees."""

from __future__ import annotations

import pytest

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


@pytest.mark.parametrize(
    "overrides",
    [
        {"LEASE_SECONDS": 0},
        {"LEASE_SECONDS": 10**400},
        {"LEASE_SECONDS": "30"},
        {"POLL_INTERVAL": float("nan")},
        {"MAX_ATTEMPTS": 2.5},
        {"MAX_ATTEMPTS": True},
        {"PREFETCH": 10**6},
        {"TICK_BATCH_SIZE": -1},
        {"MAX_PAYLOAD_BYTES": float("inf")},
    ],
)
def test_numeric_settings_out_of_range_are_errors(settings, overrides):
    settings.DISTSCHED = overrides
    errors = [w for w in check_distsched_settings(None) if w.id == "distsched.E001"]
    assert len(errors) == 1 and repr(next(iter(overrides))) in errors[0].msg


@pytest.mark.parametrize("overrides", [{"CATCH_UP": "some"}, {"LOG_FORMAT": "xml"}, {"METRICS_PUBLIC": "yes"}])
def test_choice_settings_outside_their_choices_are_errors(settings, overrides):
    settings.DISTSCHED = overrides
    assert "distsched.E002" in ids(settings)


def test_settings_at_their_bounds_are_fine(settings):
    settings.DISTSCHED = {
        "LEASE_SECONDS": 86400,
        "MAX_ATTEMPTS": 1,
        "PREFETCH": 1000,
        "RETRY_BASE_SECONDS": 0,
        "HEARTBEAT_SECONDS": 0.5,
        "LOG_FORMAT": "json",
        "METRICS_PUBLIC": True,
    }
    assert ids(settings) == set()
