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
    "HEARTBEAT_JITTER": 0.2,
    "STALE_AFTER_SECONDS": 30,
    "POLL_INTERVAL": 1.0,
    "IDLE_POLL_MAX_SECONDS": 10.0,
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
    "METRICS_MAX_QUEUES": 50,
    "QUEUES": None,
    "LOG_FORMAT": "text",
    "TICK_BATCH_SIZE": 5000,
    # Runs a worker claims (and whose successes it records) per transaction while tasks are quick.
    # Each transaction pays one durable commit (PostgreSQL: 3.5-4 ms on busy cores) and, on SQLite,
    # a whole page for every page it touched, largely the same pages whatever the batch: at 128
    # rather than 32 an in-process drain went 5,100-6,500 -> 8,700-8,900 runs/s on SQLite and
    # 2,173 -> 2,725 (medians of 6 alternating pairs) on PostgreSQL (issue 17; bench/README.md).
    "PREFETCH": 128,
    "NOTIFY": True,
    "LISTEN": True,
    "LISTEN_DATABASE_URL": "",
    "SYNCHRONOUS_CLAIMS": True,
    "TASK_REQUIRES": {},
    "LIMITS": {},
    "LIMIT_STRIPE_MIN_CONCURRENCY": 512,
    "SCHEDULES": None,  # None: no schedule is declared in code (apply changes nothing); {}: none is
    "TASK_OPTIONS": {},
    "LEADER_LEASE_SECONDS": 15,
    "RETENTION": {},
}


# The range each numeric setting must fall in (``checks`` refuses others); the worker
# applies the same bounds to its own options.
RANGES: dict[str, tuple[type, float, float]] = {
    "LEASE_SECONDS": (float, 0.001, 86400),
    "HEARTBEAT_SECONDS": (float, 0.001, 3600),
    "HEARTBEAT_JITTER": (float, 0, 0.5),
    "STALE_AFTER_SECONDS": (float, 0.001, 30 * 86400),
    "POLL_INTERVAL": (float, 0.001, 3600),
    "IDLE_POLL_MAX_SECONDS": (float, 0.001, 3600),
    "RETRY_BASE_SECONDS": (float, 0, 30 * 86400),
    "RETRY_MAX_SECONDS": (float, 0, 365 * 86400),
    "MAX_ATTEMPTS": (int, 1, 1000),
    "MAX_CATCH_UP": (int, 1, 100_000),
    "MISFIRE_GRACE_SECONDS": (float, 0, 365 * 86400),
    "MAX_PAYLOAD_BYTES": (int, 2, 100 * 1024 * 1024),
    "MAX_PAYLOAD_DEPTH": (int, 1, 100),
    "MAX_ERROR_CHARS": (int, 200, 10_000_000),
    "MAX_CLOCK_SKEW_SECONDS": (float, 0, 3600),
    "TICK_BATCH_SIZE": (int, 1, 100_000),
    "PREFETCH": (int, 1, 1000),
    "METRICS_MAX_QUEUES": (int, 1, 10_000),
    "LEADER_LEASE_SECONDS": (float, 3, 3600),
    "LIMIT_STRIPE_MIN_CONCURRENCY": (int, 1, 1_000_000),
}
CHOICES: dict[str, tuple[object, ...]] = {
    "CATCH_UP": ("skip", "one", "all"),
    "LOG_FORMAT": ("text", "json"),
    "METRICS_PUBLIC": (True, False),
    "NOTIFY": (True, False),
    "LISTEN": (True, False),
    "SYNCHRONOUS_CLAIMS": (True, False),
}


class _Conf:
    """Attribute access to DISTSCHED with defaults: ``conf.LEASE_SECONDS``."""

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"unknown distsched setting {name!r}")
        user = getattr(settings, "DISTSCHED", None) or {}
        return user.get(name, DEFAULTS[name])


conf = _Conf()
