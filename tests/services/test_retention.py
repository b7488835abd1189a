"""Retention: the leader deletes exactly the finished runs its policy names, batch by batch, fenced."""

from __future__ import annotations

from datetime import timedelta

import pytest

from distsched_app.checks import check_distsched_settings
from distsched_app.errors import NotLeader, ValidationError
from distsched_app.models import ACTIVE_STATES, AuditEntry, Leader, Run, RunEvent, RunState
from distsched_app.services import retention
from distsched_app.services.leader import DatabaseStore
from distsched_app.services.retention import Retention, parse_age, policy
from tests.conftest import T0
from tests.services.test_maintenance import make_run

pytestmark = pytest.mark.django_db

DAY = timedelta(days=1)


@pytest.fixture
def sched(make_schedule):
    return make_schedule("s1")


def fast() -> float:
    """A monotonic clock that never reaches the time budget: every batch of a call runs."""
    return 0.0


def test_deletes_exactly_what_the_policy_names_by_state_and_age(sched, settings):
    settings.DISTSCHED = {"RETENTION": {"succeeded": "7d", "dead": 30 * 86400}}
    gone = [make_run(sched, RunState.SUCCEEDED, finished_at=T0 - 8 * DAY) for _ in range(5)]
    gone.append(make_run(sched, RunState.DEAD, finished_at=T0 - 31 * DAY))
    kept = [
        make_run(sched, RunState.SUCCEEDED, finished_at=T0 - 6 * DAY),  # younger than 7 days
        make_run(sched, RunState.DEAD, finished_at=T0 - 8 * DAY),  # dead keeps 30 days
        make_run(sched, RunState.CANCELLED, finished_at=T0 - 400 * DAY),  # state not named: forever
        make_run(sched, RunState.SKIPPED, finished_at=T0 - 400 * DAY),
        *[make_run(sched, state, finished_at=T0 - 400 * DAY) for state in ACTIVE_STATES],  # never an active run
    ]
    audit_before = AuditEntry.objects.count()
    assert audit_before > 0  # creating the schedule wrote one
    done = Retention(batch_size=2, monotonic=fast).apply(T0, fence=None)
    assert (done.runs, done.events, done.more) == (6, 12, False)
    assert done.batches == 4  # succeeded: 2 + 2 + 1, dead: 1
    assert sorted(Run.objects.values_list("pk", flat=True)) == sorted(r.pk for r in kept)
    assert not RunEvent.objects.filter(run_id__in=[r.pk for r in gone]).exists()
    assert RunEvent.objects.count() == 2 * len(kept)
    assert AuditEntry.objects.count() == audit_before  # the schedule audit is never retention's


def test_stops_on_its_time_budget_and_goes_on_from_there_at_the_next_call(sched, settings):
    settings.DISTSCHED = {"RETENTION": {"succeeded": "1d"}}
    for days in range(10, 16):
        make_run(sched, RunState.SUCCEEDED, finished_at=T0 - days * DAY)
    ticks = iter(range(1000))
    walk = Retention(batch_size=2, monotonic=lambda: float(next(ticks)))  # each batch "takes" a second
    first = walk.apply(T0, fence=None, budget_seconds=2.5)  # two batches fit
    assert (first.runs, first.batches, first.more) == (4, 2, True)
    # The oldest went first: what is left is the two youngest.
    assert sorted(Run.objects.values_list("finished_at", flat=True)) == [T0 - 11 * DAY, T0 - 10 * DAY]
    second = walk.apply(T0, fence=None, budget_seconds=100)
    assert (second.runs, second.more) == (2, False)
    assert not Run.objects.exists()


def test_nothing_is_deleted_without_a_policy(sched, settings):
    settings.DISTSCHED = {}
    make_run(sched, RunState.SUCCEEDED, finished_at=T0 - 4000 * DAY)
    done = Retention(monotonic=fast).apply(T0, fence=None)
    assert (done.runs, done.batches) == (0, 0)
    assert Run.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_deposed_leader_deletes_nothing(sched, settings):
    settings.DISTSCHED = {"RETENTION": {"succeeded": "1d"}}
    make_run(sched, RunState.SUCCEEDED, finished_at=T0 - 10 * DAY)
    old = DatabaseStore().acquire(holder="a", pid=1, host="h", lease_seconds=30)
    Leader.objects.update(expires_at=T0 - DAY)  # a's lease ran out while it was paused
    new = DatabaseStore().acquire(holder="b", pid=2, host="h", lease_seconds=30)
    with pytest.raises(NotLeader):
        Retention(monotonic=fast).apply(T0, fence=old)
    assert Run.objects.count() == 1
    assert Retention(monotonic=fast).apply(T0, fence=new).runs == 1


@pytest.mark.parametrize(
    ("value", "seconds"), [("7d", 7 * 86400), ("1d12h", 36 * 3600), ("90m", 5400), (3600, 3600), (0.5, 0.5)]
)
def test_ages_are_durations_or_seconds(value, seconds):
    assert parse_age(value, state="succeeded") == timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("setting", "needle"),
    [
        ({"succeeded": "7 days"}, "not a duration"),
        ({"succeeded": 0}, "positive"),
        ({"succeeded": True}, "must be a duration"),
        ({"succeeded": None}, "must be a duration"),
        ({"running": "7d"}, "not a final state"),
        (["succeeded"], "must be a dict"),
    ],
)
def test_a_bad_policy_is_a_clear_error_and_a_failed_system_check(settings, setting, needle):
    with pytest.raises(ValidationError, match=needle):
        policy(setting)
    settings.DISTSCHED = {"RETENTION": setting}
    [error] = [e for e in check_distsched_settings(None) if e.id == "distsched.E022"]
    assert needle in error.msg and "RETENTION" in error.msg


def test_the_default_keeps_everything(settings):
    settings.DISTSCHED = {}
    assert policy() == {}
    assert retention.BATCH_SIZE <= 1000
    assert not [e for e in check_distsched_settings(None) if e.id == "distsched.E022"]
