"""The election state machine (``services.leader.Elector``) on a FakeClock and an in-memory lease.

``FakeLease`` plays the leader row with the database's rules (take over only an expired
lease, renew only your own live term) and reads the same FakeClock as the database's
clock; each call may take ``latency`` seconds, as a round trip to the database does.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import pytest

from distsched_app.clock import FakeClock
from distsched_app.db.leader import Term
from distsched_app.services.leader import STANDBY_SECONDS, Elector

LEASE = 15.0


class FakeLease:
    def __init__(self, clock: FakeClock, *, latency: float = 0.0) -> None:
        self.clock = clock
        self.latency = latency
        self.holder: str | None = None
        self.term = 0
        self.expires_at = clock.now()
        self.calls: list[tuple[str, str]] = []
        self.fail_renewals = False

    def _round_trip(self) -> datetime:
        """The database's now(): the statement runs ``latency`` after it was sent."""
        return self.clock.advance(self.latency)

    def acquire(self, *, holder: str, pid: int, host: str, lease_seconds: float) -> Term | None:
        self.calls.append(("acquire", holder))
        now = self._round_trip()
        if self.holder is not None and self.expires_at > now:
            return None
        self.holder, self.term = holder, self.term + 1
        self.expires_at = now + timedelta(seconds=lease_seconds)
        return Term("scheduler", holder, self.term, now, self.expires_at)

    def renew(self, term: Term, *, lease_seconds: float) -> datetime | None:
        self.calls.append(("renew", term.holder))
        if self.fail_renewals:
            raise ConnectionError("server closed the connection unexpectedly")
        now = self._round_trip()
        if (self.holder, self.term) != (term.holder, term.term) or self.expires_at <= now:
            return None
        self.expires_at = now + timedelta(seconds=lease_seconds)
        return self.expires_at

    def give_up(self, term: Term) -> bool:
        self.calls.append(("give_up", term.holder))
        now = self._round_trip()
        if (self.holder, self.term) != (term.holder, term.term):
            return False
        self.expires_at = now
        return True

    def count(self, kind: str, holder: str) -> int:
        return self.calls.count((kind, holder))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def monotonic_of(clock: FakeClock):
    start = clock.now()
    return lambda: (clock.now() - start).total_seconds()


def elector(name: str, lease: FakeLease, clock: FakeClock) -> Elector:
    return Elector(holder=name, lease_seconds=LEASE, store=lease, monotonic=monotonic_of(clock), pid=1, host="h")


def run_for(clock: FakeClock, seconds: float, *electors: Elector, step: float = 0.1) -> None:
    """Every elector takes a turn every ``step`` seconds for ``seconds``."""
    end = clock.now() + timedelta(seconds=seconds)
    while clock.now() < end:
        for e in electors:
            e.step()
        clock.advance(step)


def test_the_first_to_campaign_leads_and_the_others_stand_by(clock):
    lease = FakeLease(clock)
    a, b, c = (elector(n, lease, clock) for n in "abc")
    assert a.step() is True
    assert (b.step(), c.step()) == (False, False)
    run_for(clock, 30, a, b, c)
    assert [a.leading(), b.leading(), c.leading()] == [True, False, False]
    assert a.term is not None and a.term.term == 1


def test_a_standby_tries_at_most_once_a_second(clock):
    lease = FakeLease(clock)
    a, b = elector("a", lease, clock), elector("b", lease, clock)
    run_for(clock, 60, a, b, step=0.05)
    assert 55 <= lease.count("acquire", "b") <= 61


def test_the_leader_renews_every_third_of_the_lease(clock):
    lease = FakeLease(clock)
    a = elector("a", lease, clock)
    run_for(clock, 60, a, step=0.05)
    assert lease.count("acquire", "a") == 1
    assert 11 <= lease.count("renew", "a") <= 13  # 60 s / 5 s


def test_a_lost_lease_steps_down_at_once_and_says_why(clock, caplog):
    lease = FakeLease(clock)
    a = elector("a", lease, clock)
    a.step()
    lease.holder, lease.term = "intruder", 7  # someone else's term now
    clock.advance(LEASE / 3)
    with caplog.at_level(logging.WARNING, logger="distsched"):
        assert a.step() is False
    assert a.term is None
    [record] = [r for r in caplog.records if r.getMessage() == "stepped down"]
    assert "lost" in record.distsched["reason"] and record.distsched["term"] == 1


def test_a_renewal_that_errs_steps_down_before_raising(clock):
    lease = FakeLease(clock)
    a = elector("a", lease, clock)
    a.step()
    lease.fail_renewals = True
    clock.advance(LEASE / 3)
    with pytest.raises(ConnectionError):
        a.step()
    assert a.term is None and a.leading() is False


def test_a_paused_leader_stops_by_its_own_deadline_before_the_database_lease_ends(clock):
    lease = FakeLease(clock, latency=0.2)
    a = elector("a", lease, clock)
    a.step()
    expires = lease.expires_at
    # The process is paused (no step): its local deadline passes before the database's expiry.
    while a.leading():
        clock.advance(0.01)
    assert clock.now() < expires
    assert (expires - clock.now()).total_seconds() >= a.margin - 0.01


def test_another_takes_over_once_the_lease_expires_and_the_old_leader_steps_down(clock):
    lease = FakeLease(clock)
    a, b = elector("a", lease, clock), elector("b", lease, clock)
    a.step()
    run_for(clock, LEASE + STANDBY_SECONDS + 0.5, b)  # a is paused meanwhile
    assert b.leading() and b.term is not None and b.term.term == 2
    assert a.step() is False  # resumed: its deadline passed, and its renewal finds term 2
    assert a.term is None
    run_for(clock, 30, a, b)
    assert (a.leading(), b.leading()) == (False, True)


def test_resigning_hands_over_within_a_standby_try(clock):
    lease = FakeLease(clock)
    a, b = elector("a", lease, clock), elector("b", lease, clock)
    run_for(clock, 3, a, b)
    a.resign()
    assert a.term is None
    run_for(clock, STANDBY_SECONDS + 0.2, b)
    assert b.leading()


def test_wait_seconds_points_at_the_next_renewal_or_try(clock):
    lease = FakeLease(clock)
    a, b = elector("a", lease, clock), elector("b", lease, clock)
    a.step()
    b.step()
    assert a.wait_seconds() == pytest.approx(LEASE / 3)
    assert b.wait_seconds() == pytest.approx(STANDBY_SECONDS)
