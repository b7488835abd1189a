"""Leader election among tickers: one of them ticks and runs the periodic chores.

Leadership saves work and shows who does it; it guarantees nothing. A generated run
stays single by the unique constraint on its slot whatever the leader does, so two
processes that both believe they lead create no duplicate, and no process at all
leading only delays schedules.

The lease lives in one row per role (``db.leader``), on the database's clock. A
standby tries to take over at most once a second (one short statement); the leader
renews every third of the lease. A renewal that fails or errs steps down at once, and
a leader that cannot renew stops by its own deadline: the monotonic instant it *sent*
its last successful renewal plus the lease, less a margin, which is never later than
the database's expiry. Leader-only writes run ``fenced``: the transaction first checks
(PostgreSQL: locks ``FOR SHARE``) that its term still leads, so a leader paused past its
lease (SIGSTOP, a long GC, a network partition) writes nothing when it resumes.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from django.db import transaction

from ..conf import conf
from ..db import leader as store
from ..db.leader import Term
from ..errors import NotLeader
from ..text import storable

logger = logging.getLogger("distsched")

ROLE = "scheduler"
# A standby tries to take over at most this often (one statement each time).
STANDBY_SECONDS = 1.0


class Store(Protocol):
    """What the elector asks of the database (``DatabaseStore``; a fake one in unit tests)."""

    def acquire(self, *, holder: str, pid: int, host: str, lease_seconds: float) -> Term | None: ...
    def renew(self, term: Term, *, lease_seconds: float) -> datetime | None: ...
    def give_up(self, term: Term) -> bool: ...


class DatabaseStore:
    """The leader row of ``role``. A standby's try is one UPDATE (take over an expired lease);
    the INSERT of a first election follows only until the row is known to exist, and once
    every ``RECHECK_TRIES`` tries after that (an operator may have deleted the row)."""

    RECHECK_TRIES = 60

    def __init__(self, role: str = ROLE) -> None:
        self.role = role
        self._tries_since_insert: int | None = None  # None: the row is not known to exist

    def acquire(self, *, holder: str, pid: int, host: str, lease_seconds: float) -> Term | None:
        term = store.take_over(self.role, holder=holder, pid=pid, host=host, lease_seconds=lease_seconds)
        if term is not None:
            return term
        tries = self._tries_since_insert
        if tries is not None and tries < self.RECHECK_TRIES:
            self._tries_since_insert = tries + 1
            return None
        self._tries_since_insert = 0  # inserted now, or someone else's row is there
        return store.create(self.role, holder=holder, pid=pid, host=host, lease_seconds=lease_seconds)

    def renew(self, term: Term, *, lease_seconds: float) -> datetime | None:
        return store.renew(term, lease_seconds=lease_seconds)

    def give_up(self, term: Term) -> bool:
        return store.give_up(term)


def campaigner_id() -> str:
    """A ``tick --loop`` process's holder id: host, pid and a random part (two processes on one
    host, or a pid reused after a restart, never share one)."""
    host = storable(socket.gethostname()).replace(" ", "_")[:150] or "host"
    return f"{host}-{os.getpid()}-tick-{uuid.uuid4().hex[:6]}"


class Elector:
    """The election state machine of one process. Call ``step()`` often (every loop turn):
    it renews or campaigns when due and answers whether this process leads now.

    Exceptions from the database propagate (the caller's loop backs off and reconnects);
    a renewal that raises has stepped down first.
    """

    def __init__(
        self,
        *,
        holder: str,
        lease_seconds: float | None = None,
        store: Store | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        pid: int | None = None,
        host: str | None = None,
    ) -> None:
        self.holder = holder
        self.lease_seconds = float(lease_seconds if lease_seconds is not None else conf.LEADER_LEASE_SECONDS)
        self.store: Store = store if store is not None else DatabaseStore()
        self.monotonic = monotonic
        self.pid = os.getpid() if pid is None else pid
        self.host = storable(socket.gethostname())[:255] if host is None else host
        self.term: Term | None = None
        self.deadline = 0.0  # monotonic: leader work stops here unless a renewal moves it
        self.next_try = 0.0  # monotonic: the next renewal (leader) or takeover try (standby)

    @property
    def renew_every(self) -> float:
        return self.lease_seconds / 3

    @property
    def margin(self) -> float:
        """Taken off the local deadline: the monotonic clock may run a little slower than the database's."""
        return min(1.0, self.lease_seconds / 10)

    def leading(self) -> bool:
        """Whether this process leads now: it holds a term and its local deadline has not passed."""
        return self.term is not None and self.monotonic() < self.deadline

    def step(self) -> bool:
        now = self.monotonic()
        if self.term is not None and now >= self.deadline:
            self.step_down("no renewal before the lease's deadline")
        if now >= self.next_try:
            if self.term is not None:
                self._renew()
            else:
                self._campaign()
        return self.leading()

    def wait_seconds(self) -> float:
        """Until the next thing the elector must do (a try, a renewal or the deadline)."""
        due = self.next_try if self.term is None else min(self.next_try, self.deadline)
        return max(0.0, due - self.monotonic())

    def _campaign(self) -> None:
        sent = self.monotonic()
        self.next_try = sent + min(STANDBY_SECONDS, self.renew_every)
        term = self.store.acquire(holder=self.holder, pid=self.pid, host=self.host, lease_seconds=self.lease_seconds)
        if term is None:
            return
        self.term = term
        self.deadline = sent + self.lease_seconds - self.margin
        self.next_try = sent + self.renew_every
        logger.info(
            "became leader",
            extra={"distsched": {"role": term.role, "holder": term.holder, "term": term.term, "pid": self.pid}},
        )

    def _renew(self) -> None:
        term = self.term
        if term is None:
            return
        sent = self.monotonic()
        try:
            expires = self.store.renew(term, lease_seconds=self.lease_seconds)
        except Exception as exc:
            self.step_down(f"renewal failed: {type(exc).__name__}: {exc}")
            raise
        if expires is None:
            self.step_down("the lease was lost (expired or taken over)")
            return
        self.deadline = sent + self.lease_seconds - self.margin
        self.next_try = sent + self.renew_every

    def step_down(self, why: str) -> None:
        """Stop leading now (no database write: the lease expires by itself)."""
        if self.term is None:
            return
        term, self.term = self.term, None
        self.deadline = 0.0
        self.next_try = self.monotonic() + STANDBY_SECONDS
        logger.warning(
            "stepped down",
            extra={"distsched": {"role": term.role, "holder": term.holder, "term": term.term, "reason": why}},
        )

    def resign(self) -> None:
        """On a clean stop: give the lease up so a standby takes over at its next try."""
        term = self.term
        if term is None:
            return
        self.term = None
        self.deadline = 0.0
        try:
            self.store.give_up(term)
        except Exception as exc:  # noqa: BLE001 - best effort at exit: the lease then expires by itself
            logger.warning(
                "could not give up the lease; it expires by itself",
                extra={"distsched": {"term": term.term, "error": f"{type(exc).__name__}: {exc}"}},
            )
            return
        logger.info(
            "stepped down",
            extra={"distsched": {"role": term.role, "holder": term.holder, "term": term.term, "reason": "stopping"}},
        )


@contextmanager
def fenced(term: Term | None) -> Iterator[None]:
    """A transaction whose writes count only if ``term`` still leads: checked (and, on PostgreSQL,
    the leader row share-locked) first, so a deposed leader's writes never happen. ``None``:
    an ordinary transaction (a one-off ``tick``, a worker's ``run_once``)."""
    with transaction.atomic():
        if term is not None and not store.holds(term):
            raise NotLeader(f"term {term.term} of {term.holder} no longer leads")
        yield


@dataclass(frozen=True, kw_only=True)
class LeaderStatus:
    """Who leads now (all None when nobody does), and the role's term so far (0: never elected)."""

    holder: str | None
    pid: int | None
    host: str | None
    since: datetime | None
    expires_at: datetime | None
    term: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "holder": self.holder,
            "pid": self.pid,
            "host": self.host,
            "since": self.since,
            "expires_at": self.expires_at,
            "term": self.term,
        }


def status(role: str = ROLE) -> LeaderStatus:
    """The leader by the database's clock (one query)."""
    found = store.live(role)
    if found is None:
        return LeaderStatus(holder=None, pid=None, host=None, since=None, expires_at=None, term=0)
    row, alive = found
    if not alive:
        return LeaderStatus(holder=None, pid=None, host=None, since=None, expires_at=None, term=row.term)
    return LeaderStatus(
        holder=row.holder, pid=row.pid, host=row.host, since=row.since, expires_at=row.expires_at, term=row.term
    )
