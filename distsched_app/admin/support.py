"""What every distsched admin action shares: the request's clock reading and reporting service outcomes.

The admin is a thin adapter. An action or button calls one service function
per selected object and translates what comes back (a result or a typed
error from ``distsched_app.errors``) into ``message_user`` lines. No
scheduling rule lives here. The classes the ModelAdmins inherit (stylesheet,
change-page buttons) are in ``mixins``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.contrib import messages
from django.http import HttpRequest

from ..clock import current_clock
from ..errors import DistschedError, NotFound
from ..models import AuditSource

# An action applies a service to each selected row in one request; beyond this
# many rows the request would time out, so the operator is sent to the CLI/API.
MAX_ACTION_ROWS = 1000
SHOWN_ERRORS = 5


def request_now(request: HttpRequest) -> datetime:
    """The clock, read once per request and shared by every admin method that needs "now"."""
    now = getattr(request, "_distsched_now", None)
    if now is None:
        now = current_clock().now()
        request._distsched_now = now  # type: ignore[attr-defined]
    return now


def operator(request: HttpRequest) -> str:
    """Who acts in the admin, as the audit trail and the run history name them: ``user:<username>``."""
    user = getattr(request, "user", None)
    name = user.get_username() if user is not None and user.is_authenticated else "anonymous"
    return f"user:{name}"


def changed_by(request: HttpRequest, reason: str = "") -> dict[str, str]:
    """The ``actor``, ``source`` and ``reason`` keywords the schedule and run services take."""
    return {"actor": operator(request), "source": AuditSource.ADMIN, "reason": reason}


@dataclass
class Outcome:
    """What happened when one service was applied to several objects."""

    done: list[Any] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


def apply_each(keys: Iterable[Any], call: Callable[[Any], Any]) -> Outcome:
    """Call ``call(key)`` for each key; typed errors are collected, never raised.

    Each call is its own service transaction, so one refused object does not
    undo the others.
    """
    outcome = Outcome()
    for key in keys:
        try:
            outcome.done.append(call(key))
        except NotFound as exc:
            outcome.missing.append(str(exc))
        except DistschedError as exc:
            outcome.refused.append(str(exc))
    return outcome


def summarise(errors: list[str]) -> str:
    shown = "; ".join(errors[:SHOWN_ERRORS])
    more = len(errors) - SHOWN_ERRORS
    return f"{shown}; and {more} more" if more > 0 else shown


def report_problems(modeladmin: Any, request: HttpRequest, outcome: Outcome, *, verb: str, noun: str) -> None:
    """Refusals (the state forbids the action) and vanished objects are warnings, not errors."""
    if outcome.refused:
        modeladmin.message_user(
            request, f"{len(outcome.refused)} {noun}(s) not {verb}: {summarise(outcome.refused)}", messages.WARNING
        )
    if outcome.missing:
        modeladmin.message_user(
            request,
            f"{len(outcome.missing)} {noun}(s) no longer exist: {summarise(outcome.missing)}",
            messages.WARNING,
        )


def selected_keys(modeladmin: Any, request: HttpRequest, queryset: Any, key: str) -> list[Any] | None:
    """The selected rows' keys, or None (and a warning) when the selection is too big for one request."""
    keys = list(queryset.order_by().values_list(key, flat=True)[: MAX_ACTION_ROWS + 1])
    if len(keys) > MAX_ACTION_ROWS:
        modeladmin.message_user(
            request,
            f"Select at most {MAX_ACTION_ROWS} rows per action; for bulk changes use "
            "`manage.py distsched` or the REST API.",
            messages.WARNING,
        )
        return None
    return keys
