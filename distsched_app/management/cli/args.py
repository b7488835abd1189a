"""Argument types of the ``distsched`` command: each failure is one argparse line."""

from __future__ import annotations

import argparse
import json
import re
from datetime import timedelta
from typing import Any

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
MAX_ID = 2**63 - 1


def duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``45s`` or a sum such as ``1d12h``; must be positive."""
    compact = text.strip().lower()
    parts = DURATION_RE.findall(compact)
    if not parts or "".join(n + u for n, u in parts) != compact:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (use e.g. 30d, 12h, 90m, 45s or 1d12h)")
    seconds = sum(float(n) * UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive duration")
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise argparse.ArgumentTypeError(f"{text!r} is too long a duration") from None


def json_value(text: str) -> Any:
    """Any JSON document; the service checks its shape (list for args, object for kwargs)."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid JSON: {exc}") from None


def whole_number(text: str) -> int:
    """Any whole number, negative too (its range is the service's rule: a priority, say)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def object_id(text: str) -> int:
    """A database id: a whole number from 1 to 2**63-1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a run id (a whole number)") from None
    if not 1 <= value <= MAX_ID:
        raise argparse.ArgumentTypeError(f"{text!r} is not a valid run id")
    return value
