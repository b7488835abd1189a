"""Argument types of the ``distsched`` command: each failure is one argparse line."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from ...errors import InvalidPayload
from ...services.validation import decode_payload

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


def duration_or_seconds(text: str) -> timedelta:
    """A duration (``30m``, ``2h``, ``90s``, ``1d12h``) or a plain number of seconds (``600``)."""
    try:
        seconds = float(text)
    except ValueError:
        return duration(text)
    if not seconds > 0 or seconds == float("inf"):  # NaN is not > 0
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive duration")
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise argparse.ArgumentTypeError(f"{text!r} is too long a duration") from None


def json_payload(field: str) -> Callable[[str], Any]:
    """The JSON text of ``field`` (args, kwargs) decoded by the service's rule (``decode_payload``:
    not JSON, too deep, a number of too many digits are one line); the service checks its shape
    (a list for args, an object for kwargs) with the rest of the input."""

    def parse(text: str) -> Any:
        try:
            return decode_payload(text, field=field)
        except InvalidPayload as exc:
            raise argparse.ArgumentTypeError(exc.message) from None

    return parse


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
