"""Strict readers of the environment variables that configure the project.

Each reader returns the default when the variable is unset or empty, and raises
``ImproperlyConfigured`` with one line naming the variable when its value is
malformed. A typo in production (``DJANGO_SECURE_SSL_REDIRECT=yes``,
``DJANGO_SECURE_HSTS_SECONDS=1y``) must stop start-up, not fall back silently to
a default: that is why these are written here rather than taken from a lenient
library that reads unknown booleans as False. ``docs/deployment.md`` documents
every variable.
"""

from __future__ import annotations

import os
import re

from django.core.exceptions import ImproperlyConfigured

HEADER_NAME = re.compile(r"[A-Za-z0-9]+(-[A-Za-z0-9]+)*")
# scheme://host[:port]: a name (optionally *.name, Django's wildcard) or a bracketed IPv6 address.
ORIGIN = re.compile(r"https?://(\*\.)?([A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def raw(name: str) -> str:
    """The variable's value with surrounding blanks removed; "" when unset."""
    return os.environ.get(name, "").strip()


def flag(name: str, *, default: bool) -> bool:
    """``1`` is on, ``0`` is off; nothing else is accepted."""
    value = raw(name)
    if not value:
        return default
    if value not in ("0", "1"):
        raise ImproperlyConfigured(f"{name} must be 0 or 1, not {value!r}")
    return value == "1"


def seconds(name: str, *, default: int) -> int:
    """A whole, non-negative number of seconds."""
    value = raw(name)
    if not value:
        return default
    if not (value.isascii() and value.isdigit()):
        raise ImproperlyConfigured(f"{name} must be a whole number of seconds, not {value!r}")
    return int(value)


def items(name: str) -> list[str]:
    """Comma-separated values; an empty item (``a,,b``) is a mistake, not something to skip."""
    value = raw(name)
    if not value:
        return []
    parts = [part.strip() for part in value.split(",")]
    if "" in parts:
        raise ImproperlyConfigured(f"{name} has an empty item in {value!r}")
    return parts


def hosts(name: str, *, default: list[str]) -> list[str]:
    """Host names for ``ALLOWED_HOSTS``: no scheme, no path (a pasted URL is refused)."""
    values = items(name)
    for host in values:
        if "/" in host or " " in host:
            raise ImproperlyConfigured(f"{name} takes host names like scheduler.example.com, not {host!r}")
    return values or list(default)


def origins(name: str) -> list[str]:
    """Origins for ``CSRF_TRUSTED_ORIGINS``: ``https://host[:port]``, nothing after the host."""
    values = [origin.rstrip("/") for origin in items(name)]
    for origin in values:
        if not ORIGIN.fullmatch(origin):
            raise ImproperlyConfigured(f"{name} takes origins like https://scheduler.example.com, not {origin!r}")
    return values


def proxy_ssl_header(name: str) -> tuple[str, str] | None:
    """``X-Forwarded-Proto`` becomes ``("HTTP_X_FORWARDED_PROTO", "https")``, Django's form."""
    value = raw(name)
    if not value:
        return None
    if not HEADER_NAME.fullmatch(value):
        raise ImproperlyConfigured(f"{name} takes a header name like X-Forwarded-Proto, not {value!r}")
    return "HTTP_" + value.upper().replace("-", "_"), "https"


def log_level(name: str, *, default: str) -> str:
    value = raw(name).upper()
    if not value:
        return default
    if value not in LOG_LEVELS:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(LOG_LEVELS)}, not {raw(name)!r}")
    return value
