"""Retry delay: capped exponential backoff with optional jitter.

Pure: the caller adds the delay to its own ``now``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass


def retry_delay(
    attempts: int,
    *,
    base: float,
    cap: float,
    jitter: float = 0.0,
    rand: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait before retrying after failed attempt number ``attempts`` (1-based).

    ``min(base * 2**(attempts - 1), cap)``, then, if ``jitter > 0``, plus up to
    ``jitter`` times that much (so retries of many runs that failed together
    spread out instead of hammering a recovering dependency at once). ``rand``
    returns a float in [0, 1); it is injectable so tests pin the exact delay
    without patching the ``random`` module.
    """
    if attempts < 1:
        raise ValueError(f"attempts counts the attempt that just failed, so it is >= 1, not {attempts!r}")
    if base < 0 or cap < 0 or jitter < 0:
        raise ValueError("base, cap and jitter must not be negative")
    try:
        # ldexp(base, n) is base * 2**n without building a huge int; past the
        # float range the cap wins anyway (attempts=5000 must not raise).
        raw = math.ldexp(base, attempts - 1)
    except OverflowError:
        raw = math.inf
    delay = min(raw, cap)
    if jitter > 0:
        delay += delay * jitter * rand()
    return float(delay)


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How a run retries: its attempt budget and its backoff (a schedule's fields, or an
    enqueued run's own ``retry_policy``)."""

    max_attempts: int
    base: float
    cap: float
    jitter: float = 0.0

    def delay(self, attempts: int, rand: Callable[[], float] = random.random) -> float:
        return retry_delay(attempts, base=self.base, cap=self.cap, jitter=self.jitter, rand=rand)

    def as_json(self) -> dict[str, float]:
        return {"attempts": self.max_attempts, "base": self.base, "cap": self.cap, "jitter": self.jitter}

    @classmethod
    def from_json(cls, data: dict[str, float]) -> RetryPolicy:
        return cls(
            max_attempts=int(data["attempts"]), base=data["base"], cap=data["cap"], jitter=data.get("jitter", 0.0)
        )
