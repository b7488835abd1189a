"""What the metrics and the admin dashboard say about the declared limits, on top of
``limit_overrides.status``: a limit's capacity and whether it is saturated. Read-only."""

from __future__ import annotations

from datetime import datetime

from . import limit_overrides
from . import limit_rules as rules
from .limit_overrides import LimitStatus


def any_declared() -> bool:
    """Whether ``DISTSCHED["LIMITS"]`` declares a limit. A malformed value declares none here: the
    system check distsched.E005 says what is wrong, and a scrape or a dashboard does not fail for it."""
    return rules.limits_problem() is None and bool(rules.declared())


def statuses(now: datetime) -> list[LimitStatus]:
    """Every declared limit's status; ``[]`` without a query when none is declared."""
    return limit_overrides.status(now) if any_declared() else []


def capacity(status: LimitStatus) -> int | None:
    """The effective ``total`` when the limit has one, else its effective ``concurrency`` (per
    partition); None for a limit with only a rate."""
    total = status.effective["total"]
    return total if total is not None else status.effective["concurrency"]


def is_saturated(status: LimitStatus) -> bool:
    """Runs wait for it (blocked, a pause included), or it is full: its ``total`` reached, or a
    partition holding its ``concurrency`` (for a limit without partitions: in use >= concurrency)."""
    total = status.effective["total"]
    return status.blocked > 0 or status.saturated_partitions > 0 or (total is not None and status.in_use >= total)


def saturated(now: datetime) -> list[LimitStatus]:
    """The saturated limits, by name."""
    return [s for s in statuses(now) if is_saturated(s)]
