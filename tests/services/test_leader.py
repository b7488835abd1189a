"""The leader row on the real database: its clock, terms, fencing of the leader's writes, status."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from distsched_app.db import leader as store
from distsched_app.errors import NotLeader
from distsched_app.models import Leader, Run
from distsched_app.services import leader
from distsched_app.services.leader import DatabaseStore
from distsched_app.services.tick import tick
from tests.conftest import T0

pytestmark = pytest.mark.django_db(transaction=True)


def acquire(name: str, lease: float = 30.0, store_: DatabaseStore | None = None):
    return (store_ or DatabaseStore()).acquire(holder=name, pid=123, host="host-" + name, lease_seconds=lease)


def expire_now() -> None:
    """The lease ends (as if its holder had gone quiet past it): a past instant written by the ORM."""
    Leader.objects.update(expires_at=T0 - timedelta(days=1))


def test_first_election_is_term_one_and_a_live_lease_is_not_taken():
    a = acquire("a")
    assert a is not None and a.term == 1
    assert acquire("b") is None
    s = leader.status()
    assert (s.holder, s.pid, s.host, s.term) == ("a", 123, "host-a", 1)
    assert s.expires_at is not None and s.since is not None
    assert 29 <= (s.expires_at - s.since).total_seconds() <= 31  # the database's now() + lease


def test_an_expired_lease_is_taken_over_with_the_next_term_and_the_old_term_cannot_renew():
    a = acquire("a")
    expire_now()
    b = acquire("b")
    assert a is not None and b is not None and b.term == 2
    assert store.renew(a, lease_seconds=30) is None  # scoped by holder and term, never by role alone
    assert store.renew(b, lease_seconds=30) is not None
    assert store.give_up(a) is False
    assert leader.status().holder == "b"


def test_giving_up_leaves_no_leader_and_the_next_campaign_gets_a_new_term():
    a = acquire("a")
    assert a is not None and store.give_up(a) is True
    assert leader.status().holder is None and leader.status().term == 1
    b = acquire("b")
    assert b is not None and b.term == 2


def test_status_when_never_elected():
    s = leader.status()
    assert (s.holder, s.pid, s.since, s.expires_at, s.term) == (None, None, None, None, 0)


def test_a_standby_try_is_one_statement_once_the_row_exists():
    acquire("a")
    standby = DatabaseStore()
    assert acquire("b", store_=standby) is None  # learns the row exists
    with CaptureQueriesContext(connection) as queries:
        assert acquire("b", store_=standby) is None
    assert len(queries) == 1


def test_a_deposed_leaders_tick_writes_nothing(make_schedule):
    make_schedule("every-minute", interval_seconds=60, start_at=T0 - timedelta(minutes=5))
    a = acquire("a")
    expire_now()
    b = acquire("b")
    assert a is not None and b is not None
    with pytest.raises(NotLeader):
        tick(now=T0, fence=a)
    assert Run.objects.count() == 0
    assert len(tick(now=T0, fence=b)) >= 1


def test_fenced_checks_the_term_in_the_transaction():
    a = acquire("a")
    assert a is not None
    with leader.fenced(a):
        pass
    expire_now()
    with pytest.raises(NotLeader), leader.fenced(a):
        pytest.fail("the body of a fenced-out transaction must not run")
    with leader.fenced(None):  # unelected callers (a one-off tick) are not fenced
        pass


def test_a_deleted_leader_row_is_recreated_by_a_standbys_later_try():
    acquire("a")
    standby = DatabaseStore()
    assert acquire("b", store_=standby) is None  # learns the row exists
    Leader.objects.all().delete()  # an operator's cleanup
    for _ in range(DatabaseStore.RECHECK_TRIES):
        assert acquire("b", store_=standby) is None  # the cheap try only: no INSERT yet
    term = acquire("b", store_=standby)
    assert term is not None and term.term == 1
