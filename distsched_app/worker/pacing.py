"""How often a live worker talks to the database when nothing happens: the heartbeat's jitter and
the idle poll's backoff.

At a thousand workers these, not the work, are the database's load (``bench/thousand_workers.py``).
A fleet started together (a deploy) would beat in lockstep: every interval is shortened by a random
share of up to ``HEARTBEAT_JITTER`` (never lengthened, so a lease of ``LEASE_SECONDS`` stays as safe
as the setting pair says). An idle worker that is woken by notifications (PostgreSQL with LISTEN
working) polls only as a safety net, so its poll interval doubles while polls find nothing, from
``POLL_INTERVAL`` up to ``IDLE_POLL_MAX_SECONDS`` (bounded by half the lease: an abandoned run is
still recovered soon after its lease expires); without a listener it stays at ``POLL_INTERVAL``,
the only way it learns of new runs.
"""

from __future__ import annotations

import random
from collections.abc import Callable


def jittered(seconds: float, jitter: float, rand: Callable[[], float] = random.random) -> float:
    """``seconds`` shortened by a random share of up to ``jitter`` (0..1): within
    ``[seconds * (1 - jitter), seconds]``."""
    return seconds * (1.0 - jitter * rand())


class IdleBackoff:
    """The idle poll interval: ``poll`` at first and whenever work was found or nobody listens,
    doubling with every empty poll while listening, up to ``ceiling``; jittered like the heartbeat."""

    def __init__(
        self, *, poll: float, ceiling: float, jitter: float, rand: Callable[[], float] = random.random
    ) -> None:
        self.poll = poll
        self.ceiling = max(poll, ceiling)
        self.jitter = jitter
        self.rand = rand
        self.current = poll

    def found_work(self) -> None:
        self.current = self.poll

    def next_delay(self, *, listening: bool) -> float:
        """How long the next idle wait may last (an earlier due run or slot shortens it: the loop's business)."""
        if not listening:
            self.current = self.poll
            return self.poll
        delay = jittered(self.current, self.jitter, self.rand)
        self.current = min(self.ceiling, self.current * 2)
        return max(self.poll, delay)


def idle_ceiling(*, poll: float, lease_seconds: float, maximum: float) -> float:
    """The longest idle poll: ``IDLE_POLL_MAX_SECONDS``, at most half the lease, never under the poll."""
    return max(poll, min(maximum, lease_seconds / 2))
