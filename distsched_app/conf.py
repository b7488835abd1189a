"""The only reader of ``settings.DISTSCHED``.

Values are looked up on every access, so ``override_settings`` and
pytest-django's ``settings`` fixture take effect immediately.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    "LEASE_SECONDS": 30,
    "HEARTBEAT_SECONDS": 5,
    "STALE_AFTER_SECONDS": 30,
    "POLL_INTERVAL": 1.0,
    "RETRY_BASE_SECONDS": 10,
    "RETRY_MAX_SECONDS": 3600,
    "MAX_ATTEMPTS": 3,
    "CATCH_UP": "one",
    "MAX_CATCH_UP": 100,
    "MISFIRE_GRACE_SECONDS": 60,
    "MAX_PAYLOAD_BYTES": 65536,
    "MAX_PAYLOAD_DEPTH": 32,
    "MAX_ERROR_CHARS": 20000,
    "MAX_CLOCK_SKEW_SECONDS": 2,
    "METRICS_PUBLIC": False,
    "LOG_FORMAT": "text",
    "TICK_BATCH_SIZE": 5000,
    "PREFETCH": 32,
}


class _Conf:
    """Attribute access to DISTSCHED with defaults: ``conf.LEASE_SECONDS``."""

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"unknown distsched setting {name!r}")
        user = getattr(settings, "DISTSCHED", None) or {}
        return user.get(name, DEFAULTS[name])


conf = _Conf()
