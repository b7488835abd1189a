"""System checks: warn about settings that break distsched's guarantees."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Warning, register

from .conf import DEFAULTS


@register()
def check_distsched_settings(app_configs, **kwargs):  # noqa: ANN001, ANN201 - Django's check signature
    problems = []
    user = getattr(settings, "DISTSCHED", None) or {}
    for key in user:
        if key not in DEFAULTS:
            problems.append(Warning(f"Unknown DISTSCHED setting {key!r}.", id="distsched.W001"))
    problems.extend(sqlite_mode_warnings(settings.DATABASES))
    lease = user.get("LEASE_SECONDS", DEFAULTS["LEASE_SECONDS"])
    beat = user.get("HEARTBEAT_SECONDS", DEFAULTS["HEARTBEAT_SECONDS"])
    if isinstance(lease, int | float) and isinstance(beat, int | float) and beat * 2 > lease:
        problems.append(Warning(
            "DISTSCHED HEARTBEAT_SECONDS should be at most half of LEASE_SECONDS.",
            hint="Otherwise a healthy worker can lose the lease of a long task.",
            id="distsched.W003",
        ))
    return problems


def sqlite_mode_warnings(databases: dict) -> list[Warning]:
    problems = []
    for alias, db in databases.items():
        if db.get("ENGINE") == "django.db.backends.sqlite3":
            mode = (db.get("OPTIONS") or {}).get("transaction_mode")
            if mode != "IMMEDIATE":
                problems.append(Warning(
                    f"Database {alias!r} is SQLite without OPTIONS['transaction_mode'] = 'IMMEDIATE'.",
                    hint="Concurrent workers then fail with 'database is locked' on lock upgrade.",
                    id="distsched.W002",
                ))
    return problems
