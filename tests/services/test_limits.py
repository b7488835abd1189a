"""Flow control in the claim (services.limits, limit_rules, limit_overrides) with a fake clock:
concurrency per partition and in total, rates, fairness, local caps, prefetch, release in the
transaction that frees a slot, the sweep, overrides, and the missing-key rule."""

from __future__ import annotations

from datetime import timedelta

import pytest

from distsched_app.checks import check_distsched_settings
from distsched_app.errors import ValidationError
from distsched_app.models import EventType, LimitEvent, LimitHold, Run, RunEvent, RunState
from distsched_app.services import claiming, limit_overrides, limits, outcomes
from distsched_app.services import limit_rules as rules
from distsched_app.services.enqueue import Job, enqueue
from tests.conftest import T0

pytestmark = pytest.mark.django_db


@pytest.fixture
def declare(settings):
    def apply(limits_: dict) -> None:
        settings.DISTSCHED = {**settings.DISTSCHED, "LIMITS": limits_}

    return apply


def add(task: str = "tests.echo", *, at=T0, queue: str = "default", **kwargs) -> Run:
    return enqueue(Job(task_name=task, kwargs=kwargs, queue=queue), now=at).run


def claim(clock, worker: str = "w1", *, limit: int = 1, start_all: bool = False, lease: float = 30) -> list[Run]:
    return claiming.claim_runs(
        worker_id=worker, queues=None, lease_seconds=lease, now=clock.now(), limit=limit, start_all=start_all
    )


def succeed(run: Run, clock, worker: str = "w1") -> None:
    outcomes.record_successes(
        worker_id=worker,
        successes=[
            outcomes.Success(run_id=run.pk, attempt=run.attempts, started_at=clock.now(), finished_at=clock.now())
        ],
        now=clock.now(),
    )


def state(run: Run) -> str:
    return Run.objects.get(pk=run.pk).state


# -- the rules ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limits_", "message"),
    [
        ({"x": {"concurrency": 1}}, "applies to nothing"),
        ({"x": {"task": "t"}}, "limits nothing"),
        ({"x": {"task": "t", "rate": "5/w"}}, "rate must look like"),
        ({"x": {"task": "t", "concurrency": -1}}, "whole number"),
        ({"x": {"task": "t", "concurrency": 1, "colour": "red"}}, "unknown key"),
        ({"x": {"task": "t", "total": 2}}, "needs 'partition_by'"),
        ({"x": {"task": "t", "concurrency": 1, "fair": True, "partition_by": ["a"]}}, "needs 'total'"),
        ({"x": {"task": "t", "concurrency": 1, "missing": "maybe", "partition_by": ["a"]}}, "missing must be"),
        ({"x": {"task": "t", "concurrency": 1, "partition_by": ["nope.module:f"]}}, "cannot be imported"),
        ({"bad name": {"task": "t", "concurrency": 1}}, "invalid limit name"),
        ([1], "must be a dict"),
    ],
)
def test_an_invalid_limit_is_a_system_check_error_with_the_reason(declare, limits_, message):
    declare(limits_)
    errors = [e for e in check_distsched_settings(None) if e.id == "distsched.E005"]
    assert len(errors) == 1 and message in errors[0].msg


def test_valid_limits_pass_the_check(declare):
    declare({"a": {"task": "t", "concurrency": 2, "rate": "10/30s", "partition_by": ["kwargs.x.y", "args.0"]}})
    assert [e for e in check_distsched_settings(None) if e.id == "distsched.E005"] == []


def test_partition_keys_follow_paths_and_the_missing_rule():
    spec = rules.parse_limit("l", {"task": "t", "concurrency": 1, "partition_by": ["account_id"]})
    assert rules.partition_key(spec, "t", [], {"account_id": 42}) == "42"
    with pytest.raises(rules.LimitKeyMissing, match="account_id"):
        rules.partition_key(spec, "t", [], {})
    nested = rules.parse_limit("l", {"task": "t", "concurrency": 1, "partition_by": ["kwargs.c.id", "args.1"]})
    assert rules.partition_key(nested, "t", ["a", "b"], {"c": {"id": "x"}}) == "x\x1fb"
    shared = rules.parse_limit("l", {"task": "t", "concurrency": 1, "partition_by": ["a"], "missing": "shared"})
    assert rules.partition_key(shared, "t", [], {}) == ""
    exempt = rules.parse_limit("l", {"task": "t", "concurrency": 1, "partition_by": ["a"], "missing": "exempt"})
    assert rules.partition_key(exempt, "t", [], {}) is None


def test_gcra_never_admits_more_than_n_in_any_window_checked_by_brute_force():
    """Offered starts at random times; the admitted ones never exceed N in any window of the period."""
    import random

    rng = random.Random(7)
    for rate_text, burst in [("5/s", 1), ("3/2s", 1), ("10/m", 1), ("4/s", 3)]:
        rate = rules.parse_rate(rate_text)
        tat, admitted, now = None, [], T0
        for _ in range(2000):
            now += timedelta(seconds=rng.expovariate(3 * rate.count / rate.period))
            if rules.conforms(rate, burst, tat, now):
                admitted.append(now)
                tat = rules.next_tat(rate, tat, now)
        bound = rate.count + burst - 1
        period = timedelta(seconds=rate.period)
        for i, start in enumerate(admitted):  # every window [start, start + period)
            inside = sum(1 for t in admitted[i : i + bound + 2] if t < start + period)
            assert inside <= bound, (rate_text, burst, start)
        # A backlog offered at each earliest start (as throttled runs' available_at are) keeps the rate.
        tat, now, starts = None, T0, 0
        while now < T0 + timedelta(seconds=10 * rate.period):
            assert rules.conforms(rate, burst, tat, now)
            starts, tat = starts + 1, rules.next_tat(rate, tat, now)
            now = rules.earliest_start(rate, burst, tat, now)
        assert starts >= 10 * rate.count


# -- concurrency ---------------------------------------------------------------------------------


def test_a_concurrency_limit_blocks_the_run_beyond_it_and_the_holders_end_lets_it_through(declare, clock):
    declare({"one": {"task": "tests.echo", "concurrency": 1}})
    a, b = add(), add(at=T0 + timedelta(seconds=1))
    clock.advance(2)
    assert [r.pk for r in claim(clock)] == [a.pk]
    assert claim(clock, "w2") == []
    assert state(b) == RunState.BLOCKED
    assert Run.objects.get(pk=b.pk).held_by == "limit:one:"
    blocked = RunEvent.objects.get(run_id=b.pk, event_type=EventType.BLOCKED)
    assert "limit one is full (1/1 running)" in blocked.message
    assert Run.objects.get(pk=b.pk).attempts == 0  # waiting uses no attempt
    succeed(Run.objects.get(pk=a.pk), clock)
    assert state(b) == RunState.PENDING  # released in the transaction that ended a
    assert RunEvent.objects.filter(run_id=b.pk, event_type=EventType.UNBLOCKED).count() == 1
    assert [r.pk for r in claim(clock, "w2")] == [b.pk]


def test_unlimited_runs_behind_blocked_ones_are_claimed_by_the_same_claim(declare, clock):
    declare({"one": {"task": "tests.echo", "concurrency": 1}})
    limited = [add(at=T0 + timedelta(seconds=i)) for i in range(5)]
    free = add("tests.fail", at=T0 + timedelta(seconds=10))
    clock.advance(20)
    first = claim(clock, limit=8, start_all=True)
    assert {r.pk for r in first} == {limited[0].pk, free.pk}
    assert all(state(r) == RunState.BLOCKED for r in limited[1:])


def test_a_per_key_limit_runs_different_keys_side_by_side_but_never_two_of_one_key(declare, clock):
    declare({"acct": {"task": "tests.echo", "concurrency": 1, "partition_by": ["account"]}})
    a1, a2, b1 = add(account=1), add(account=1), add(account=2)
    clock.advance(1)
    got = claim(clock, limit=3, start_all=True)
    assert {r.pk for r in got} == {a1.pk, b1.pk}
    assert state(a2) == RunState.BLOCKED
    assert Run.objects.get(pk=a1.pk).limit_keys == {"acct": "1"}


def test_a_missing_key_refuses_the_enqueue_unless_the_limit_shares_or_exempts(declare, clock):
    declare({"acct": {"task": "tests.echo", "concurrency": 1, "partition_by": ["account"]}})
    with pytest.raises(rules.LimitKeyMissing):
        add()
    assert Run.objects.count() == 0
    declare({"acct": {"task": "tests.echo", "concurrency": 1, "partition_by": ["account"], "missing": "exempt"}})
    add(), add()
    clock.advance(1)
    assert len(claim(clock, limit=2, start_all=True)) == 2


def test_a_limited_run_is_never_prefetched_beyond_free_threads(declare, clock):
    declare({"two": {"task": "tests.echo", "concurrency": 2}})
    runs = [add(at=T0 + timedelta(seconds=i)) for i in range(4)]
    clock.advance(10)
    got = claim(clock, limit=4)  # one thread (prefetch): one limited run, started
    assert [r.pk for r in got] == [runs[0].pk]
    assert state(runs[0]) == RunState.RUNNING
    assert all(state(r) == RunState.PENDING for r in runs[1:])  # not blocked: the limit is not full
    assert [r.pk for r in claim(clock, "w2", limit=4)] == [runs[1].pk]


def test_total_with_fair_gives_freed_slots_to_the_partition_admitted_least_recently(declare, clock):
    declare({"gpu": {"task": "tests.echo", "total": 1, "fair": True, "partition_by": ["tenant"]}})
    big = [add(tenant="big", at=T0 + timedelta(seconds=i)) for i in range(6)]
    small = [add(tenant="small", at=T0 + timedelta(seconds=10 + i)) for i in range(2)]
    clock.advance(30)
    order = []
    for _ in range(8):
        got = claim(clock, limit=8, start_all=True)
        assert len(got) == 1
        order.append(Run.objects.get(pk=got[0].pk).kwargs["tenant"])
        succeed(Run.objects.get(pk=got[0].pk), clock)
        clock.advance(1)
    assert order[:5].count("small") == 2  # interleaved, not after all of big
    assert {r.pk for r in big + small} == set(Run.objects.filter(state=RunState.SUCCEEDED).values_list("id", flat=True))


def test_local_caps_a_worker_and_leaves_the_run_to_another(declare, clock):
    declare({"loc": {"task": "tests.echo", "concurrency": 10, "local": 1}})
    add(), (b := add())
    clock.advance(1)
    assert len(claim(clock, "w1", limit=2, start_all=True)) == 1
    assert state(b) == RunState.PENDING
    assert [r.pk for r in claim(clock, "w2", limit=2, start_all=True)] == [b.pk]


# -- rate ------------------------------------------------------------------------------------------


def test_a_rate_limit_throttles_with_a_later_available_at_and_no_attempt(declare, clock):
    declare({"r": {"task": "tests.echo", "rate": "2/s"}})
    runs = [add(at=T0) for _ in range(4)]
    clock.advance(1)
    got = claim(clock, limit=4, start_all=True)
    assert len(got) == 1
    waiting = Run.objects.filter(pk__in=[r.pk for r in runs]).exclude(pk=got[0].pk)
    assert all(r.state == RunState.PENDING and r.attempts == 0 for r in waiting)
    assert sorted(r.available_at for r in waiting) == [
        clock.now() + timedelta(seconds=0.5 * k) for k in (1, 2, 3)
    ]  # spaced one interval apart
    assert RunEvent.objects.filter(event_type=EventType.THROTTLED).count() == 3
    assert claiming.next_due(queues=None).run == clock.now() + timedelta(seconds=0.5)
    clock.advance(0.5)
    assert len(claim(clock, limit=4, start_all=True)) == 1


def test_retries_and_lease_recovery_go_through_admission(declare, clock):
    declare({"one": {"task": "tests.echo", "concurrency": 1}})
    a, b = add(), add(at=T0 + timedelta(seconds=1))
    clock.advance(2)
    claim(clock, lease=5)
    claim(clock, "w2")
    assert state(b) == RunState.BLOCKED
    clock.advance(6)  # a's worker died; its lease expired
    got = claim(clock, "w2", limit=2, start_all=True)
    assert [r.pk for r in got] == [a.pk]  # re-admitted; b let through by the release, blocked again
    assert state(b) == RunState.BLOCKED
    assert LimitHold.objects.get(run_id=a.pk).attempt == 2


# -- sweep and overrides -----------------------------------------------------------------------------


def test_the_sweep_lets_through_what_an_expired_lease_freed(declare, clock):
    declare({"one": {"task": "tests.echo", "concurrency": 1}})
    add(), (b := add(at=T0 + timedelta(seconds=1)))
    clock.advance(2)
    claim(clock, lease=5)
    claim(clock, "w2")
    assert state(b) == RunState.BLOCKED
    clock.advance(6)
    assert limits.sweep(clock.now()) == 1
    assert state(b) == RunState.PENDING


def test_an_override_applies_on_the_next_claim_is_audited_and_expires(declare, clock):
    declare({"one": {"task": "tests.echo", "concurrency": 1}})
    runs = [add(at=T0 + timedelta(seconds=i)) for i in range(3)]
    clock.advance(5)
    claim(clock, limit=3, start_all=True)
    assert [state(r) for r in runs] == [RunState.RUNNING, RunState.BLOCKED, RunState.BLOCKED]
    change = limit_overrides.set_override(
        "one", {"concurrency": 3}, now=clock.now(), by="user:ops", reason="backlog", for_seconds=60
    )
    assert change.released == 2  # let through in the same transaction
    assert len(claim(clock, "w2", limit=3, start_all=True)) == 2
    event = LimitEvent.objects.get()
    assert (event.action, event.actor, event.reason, event.override) == (
        "set",
        "user:ops",
        "backlog",
        {"concurrency": 3},
    )
    clock.advance(61)
    limits.sweep(clock.now())
    assert list(LimitEvent.objects.values_list("action", flat=True)) == ["expired", "set"]
    assert limit_overrides.status(clock.now())[0].effective["concurrency"] == 1


def test_a_paused_limit_blocks_until_reset(declare, clock):
    declare({"one": {"task": "tests.echo", "concurrency": 5}})
    a = add()
    limit_overrides.set_override("one", {"paused": True}, now=clock.now(), by="user:ops")
    clock.advance(1)
    assert claim(clock) == []
    assert state(a) == RunState.BLOCKED
    limit_overrides.reset_override("one", now=clock.now(), by="user:ops")
    assert state(a) == RunState.PENDING


def test_overrides_refuse_unknown_limits_and_bad_numbers(declare, clock):
    declare({"one": {"task": "tests.echo", "concurrency": 5}})
    with pytest.raises(limit_overrides.UnknownLimit):
        limit_overrides.set_override("two", {"concurrency": 1}, now=clock.now(), by="x")
    with pytest.raises(ValidationError):
        limit_overrides.set_override("one", {"concurrency": "many"}, now=clock.now(), by="x")
    with pytest.raises(ValidationError):
        limit_overrides.set_override("one", {"colour": 1}, now=clock.now(), by="x")
    assert LimitEvent.objects.count() == 0


def test_the_documented_example_of_limits_is_valid(declare):
    from pathlib import Path

    text = Path(__file__).resolve().parents[2].joinpath("docs", "explanation", "flow-control.md").read_text()
    section = text.split("# Flow control: limits", 1)[1]
    code = section.split("```python", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(code, namespace)  # noqa: S102 - our own docs
    declare(namespace["DISTSCHED"]["LIMITS"])
    assert [e for e in check_distsched_settings(None) if e.id == "distsched.E005"] == []
    assert sorted(rules.declared()) == ["billing", "gpu", "partner-api", "reports"]


def test_every_run_state_has_a_task_framework_status():
    from distsched_app.task_results import STATUS_OF_STATE

    assert set(STATUS_OF_STATE) == set(RunState.values)
    assert STATUS_OF_STATE[RunState.BLOCKED] == STATUS_OF_STATE[RunState.PENDING]


def test_a_schedule_whose_runs_would_lack_the_partition_key_is_refused(declare, clock):
    from distsched_app.models import Schedule
    from distsched_app.services.schedules import create_schedule, update_schedule

    declare({"acct": {"task": "tests.echo", "concurrency": 1, "partition_by": ["account"]}})
    with pytest.raises(rules.LimitKeyMissing):
        create_schedule(name="s", task_name="tests.echo", interval_seconds=60, now=clock.now())
    assert not Schedule.objects.exists()
    create_schedule(name="s", task_name="tests.echo", interval_seconds=60, kwargs={"account": 1}, now=clock.now())
    with pytest.raises(rules.LimitKeyMissing):
        update_schedule("s", kwargs={}, now=clock.now())
    assert Schedule.objects.get().kwargs == {"account": 1}


def test_resetting_an_override_whose_time_is_up_records_its_expiry_not_a_reset(declare, clock):
    declare({"one": {"task": "tests.echo", "concurrency": 1}})
    limit_overrides.set_override("one", {"concurrency": 3}, now=clock.now(), by="user:a", for_seconds=30)
    clock.advance(31)
    change = limit_overrides.reset_override("one", now=clock.now(), by="user:b")
    assert change.override is None and change.released == 0
    assert list(LimitEvent.objects.values_list("action", "actor")) == [("expired", "distsched"), ("set", "user:a")]


def test_a_hold_left_from_an_earlier_attempt_never_counts_and_the_sweep_drops_it(declare, settings, clock):
    declare({"one": {"task": "tests.echo", "concurrency": 1}})
    run = add()
    clock.advance(1)
    claim(clock)
    declare({})  # a deploy drops the limit: the failure's release has nothing to free
    outcomes.record_failure(worker_id="w1", run_id=run.pk, attempt=1, error="x", now=clock.now())
    clock.advance(3600)
    claim(clock)  # the retry runs at attempt 2, the attempt-1 hold still there
    declare({"one": {"task": "tests.echo", "concurrency": 1}})
    assert limits.in_use("one", clock.now()) == 0
    assert limit_overrides.status(clock.now())[0].in_use == 0
    limits.sweep(clock.now())
    assert not LimitHold.objects.exists()


def test_an_override_cannot_give_a_total_to_a_limit_without_partitions(declare, clock):
    declare({"one": {"task": "tests.echo", "concurrency": 1}})
    with pytest.raises(ValidationError, match="total needs partition_by"):
        limit_overrides.set_override("one", {"total": 3}, now=clock.now(), by="user:a")


def test_a_total_without_fair_lets_through_a_run_whose_partition_has_room(declare, clock):
    declare({"gpu": {"task": "tests.echo", "total": 2, "concurrency": 1, "partition_by": ["tenant"]}})
    x1, y1 = add(tenant="x"), add(tenant="y", at=T0 + timedelta(seconds=1))
    x2, y2 = add(tenant="x", at=T0 + timedelta(seconds=2)), add(tenant="y", at=T0 + timedelta(seconds=3))
    clock.advance(5)
    assert {r.pk for r in claim(clock, limit=4, start_all=True)} == {x1.pk, y1.pk}
    succeed(Run.objects.get(pk=y1.pk), clock)
    assert (state(x2), state(y2)) == (RunState.BLOCKED, RunState.PENDING)  # x is still full
    assert [r.pk for r in claim(clock, "w2", limit=4, start_all=True)] == [y2.pk]


def test_a_release_lets_through_one_run_per_freed_slot_and_the_sweep_does_not_add_another(declare, clock):
    declare({"one": {"task": "tests.echo", "concurrency": 1}})
    holder = add()
    claim(clock)
    low, high = add(at=T0 + timedelta(seconds=1)), add(at=T0 + timedelta(seconds=2), queue="hold")
    Run.objects.filter(pk=high.pk).update(priority=10)
    clock.advance(3)
    claim(clock, "w2", limit=2, start_all=True)
    assert (state(low), state(high)) == (RunState.BLOCKED, RunState.BLOCKED)
    succeed(Run.objects.get(pk=holder.pk), clock)
    assert (state(low), state(high)) == (RunState.BLOCKED, RunState.PENDING)  # the higher priority first
    assert limits.sweep(clock.now()) == 0  # high is pending, not claimed yet: the slot is spoken for
    assert state(low) == RunState.BLOCKED


def test_an_override_that_sets_a_total_is_enforced(declare, clock):
    declare({"t": {"task": "tests.echo", "concurrency": 5, "partition_by": ["tenant"]}})
    runs = [add(tenant=f"t{i}", at=T0 + timedelta(seconds=i)) for i in range(3)]
    limit_overrides.set_override("t", {"total": 1}, now=clock.now(), by="user:ops")
    clock.advance(5)
    assert len(claim(clock, limit=3, start_all=True)) == 1
    assert sorted(state(r) for r in runs) == [RunState.BLOCKED, RunState.BLOCKED, RunState.RUNNING]


# -- the release check skipped while the limit was never more than half full ---------------------


def _spy_let_through(monkeypatch) -> list[tuple[str, str]]:
    calls: list[tuple[str, str]] = []
    real = limits.let_through

    def spy(limit: str, key: str, **kwargs):
        calls.append((limit, key))
        return real(limit, key, **kwargs)

    monkeypatch.setattr(limits, "let_through", spy)
    return calls


def test_releasing_a_slot_taken_while_the_limit_was_roomy_skips_the_partition_when_nothing_is_blocked(
    declare, clock, monkeypatch
):
    """A slot taken with the limit at most half full (not ``tight``) frees without locking the
    partition or looking for blocked runs one by one: nothing can be waiting behind it."""
    declare({"wide": {"task": "tests.echo", "concurrency": 4}})
    run = add()
    [claimed] = claim(clock)
    assert LimitHold.objects.get(run_id=run.pk).tight is False
    calls = _spy_let_through(monkeypatch)
    succeed(claimed, clock)
    assert calls == [] and not LimitHold.objects.exists()


def test_a_roomy_slot_freed_after_the_limit_filled_still_lets_the_blocked_run_through(declare, clock, monkeypatch):
    """The skip must not strand a run: the first slot was taken while the limit was roomy (not
    tight); then the limit filled and a run was blocked. Freeing that first slot sees the blocked
    run (in the release's own statement) and lets it through in the same transaction."""
    declare({"two": {"task": "tests.echo", "concurrency": 2}})
    first, second = add(), add(at=T0 + timedelta(seconds=1))
    waiting = add(at=T0 + timedelta(seconds=2))
    clock.advance(5)
    [one] = claim(clock)
    [two] = claim(clock, "w2")
    assert dict(LimitHold.objects.values_list("run_id", "tight")) == {first.pk: False, second.pk: True}
    assert claim(clock, "w3") == [] and state(waiting) == RunState.BLOCKED
    calls = _spy_let_through(monkeypatch)
    succeed(one, clock)
    assert calls == [("two", "")]
    assert state(waiting) == RunState.PENDING
    assert [r.pk for r in claim(clock, "w3")] == [waiting.pk]
    assert two.pk == second.pk
