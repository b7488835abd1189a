"""Striped admission (``services.limits``, ``db.admission``): a large unpartitioned concurrency cap
split over lock stripes on PostgreSQL, each stripe admitting up to its share under its own lock.

The tests lower ``LIMIT_STRIPE_MIN_CONCURRENCY`` to 8 so that a cap of 8 is striped (8 stripes of one slot
each), where every share is used up at once and the whole-limit path is exercised too. What
must hold: the limit is never exceeded (racing claims on their own connections, a lowered cap
whose stripes are over their new shares), a run beyond the cap is blocked and let through when
a slot frees, a holder whose lease expired frees its slot. On SQLite nothing is striped (its
claim holds the write lock); the same tests check the same limits there.
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connections, transaction

from distsched_app.db import admission
from distsched_app.models import LimitHold, Run, RunState
from distsched_app.services import claiming, limit_overrides, limits, outcomes
from distsched_app.services.enqueue import Job, enqueue_many
from tests.conftest import T0, is_postgres

CAP = 8


@pytest.fixture
def striped(settings):
    """A concurrency-``CAP`` limit on ``tests.echo``, striped (one slot per stripe) on PostgreSQL."""
    settings.DISTSCHED = {
        **settings.DISTSCHED,
        "LIMITS": {"wide": {"task": "tests.echo", "concurrency": CAP}},
        "LIMIT_STRIPE_MIN_CONCURRENCY": 8,
    }
    limits._expected.clear()
    yield
    limits._expected.clear()


def _add(count: int) -> list[int]:
    return [r.pk for r in enqueue_many([Job(task_name="tests.echo", kwargs={})] * count, now=T0)]


def _claim(worker: str, now, *, limit: int = 1) -> list[Run]:
    return claiming.claim_runs(
        worker_id=worker, queues=None, lease_seconds=30, now=now, limit=limit, start_all=True, include_expired=True
    )


def _live(now) -> int:
    return limits.in_use("wide", now, key="")


def _states(ids: list[int]) -> Counter[str]:
    return Counter(Run.objects.filter(pk__in=ids).values_list("state", flat=True))


@pytest.mark.django_db
def test_a_striped_limit_admits_up_to_its_cap_spread_over_stripes_then_blocks_and_releases(striped):
    ids = _add(CAP + 3)
    now = T0 + timedelta(seconds=1)
    taken: list[Run] = []
    for i in range(6):  # six workers, each claiming up to 3 runs
        taken += _claim(f"w{i}", now, limit=3)
    assert len(taken) == CAP and _live(now) == CAP
    assert _states(ids) == {RunState.RUNNING: CAP, RunState.BLOCKED: 3}
    stripes = Counter(LimitHold.objects.values_list("stripe", flat=True))
    if is_postgres():  # one hold per stripe: every share (1) used, none exceeded
        assert stripes == {i: 1 for i in range(admission.STRIPES)}
        assert limits.striped(limits.rules.declared()["wide"])
    else:
        assert stripes == {0: CAP}
    first = taken[0]
    outcomes.record_successes(
        worker_id=first.lease_owner,
        successes=[outcomes.Success(run_id=first.pk, attempt=first.attempts, started_at=now, finished_at=now)],
        now=now,
    )
    assert _states(ids)[RunState.BLOCKED] == 2  # one let through by the release
    assert len(_claim("w9", now, limit=3)) == 1
    assert _live(now) == CAP
    if is_postgres():  # it took the stripe the success freed: still one hold per stripe
        assert Counter(LimitHold.objects.values_list("stripe", flat=True)) == {i: 1 for i in range(admission.STRIPES)}


@pytest.mark.django_db
def test_a_claim_under_a_roomy_striped_limit_locks_one_stripe_not_the_partition(striped, monkeypatch):
    """With room in its stripe a claim takes that stripe's lock alone (no wait, no partition row);
    its next claim tries the same stripe first."""
    calls: list[dict] = []
    real = admission.lock_and_count
    monkeypatch.setattr(admission, "lock_and_count", lambda *a, **k: calls.append(k) or real(*a, **k))
    _add(2)
    now = T0 + timedelta(seconds=1)
    [run] = _claim("solo", now)
    if not is_postgres():
        assert calls == []  # SQLite: no row locks at all
        return
    assert [(k.get("stripes"), k.get("prefer") is not None) for k in calls] == [(True, True)]
    stripe = LimitHold.objects.get(run_id=run.pk).stripe
    assert limits._expected["solo"][2] == {("wide", ""): stripe}


@pytest.mark.django_db(transaction=True)
def test_racing_claims_on_their_own_connections_never_admit_past_a_striped_cap(striped):
    """Six claimers, each on its own connection, start together and claim until nothing is left:
    exactly ``CAP`` runs are admitted, the rest blocked, and no stripe holds more than its share."""
    ids = _add(40)
    now = T0 + timedelta(seconds=1)
    barrier = threading.Barrier(6)
    errors: list[BaseException] = []

    def claimer(n: int) -> None:
        try:
            barrier.wait(timeout=30)
            for _ in range(20):
                if (
                    not _claim(f"racer{n}", now, limit=4)
                    and not Run.objects.filter(pk__in=ids, state=RunState.PENDING).exists()
                ):
                    break
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    states = _states(ids)
    assert states[RunState.RUNNING] + states[RunState.LEASED] == CAP, states
    assert _live(now) == CAP
    per_stripe = Counter(LimitHold.objects.values_list("stripe", flat=True))
    if is_postgres():
        assert max(per_stripe.values()) == 1, per_stripe


@pytest.mark.django_db
def test_a_lowered_cap_admits_nothing_while_the_stripes_hold_more_than_it(striped, clock):
    """An override halves the cap while every stripe holds its old share: the stripes are over
    their new shares, so claims take the whole-limit path, which counts all holders: nothing is
    admitted until the holders fall below the new cap, then only up to it."""
    ids = _add(20)
    clock.advance(1)
    taken = _claim("w1", clock.now(), limit=CAP)
    assert len(taken) == CAP
    limit_overrides.set_override("wide", {"concurrency": CAP // 2}, now=clock.now(), by="test")
    assert _claim("w2", clock.now(), limit=3) == []
    for run in taken[:5]:  # 3 left holding, below the new cap of 4
        outcomes.record_successes(
            worker_id="w1",
            successes=[outcomes.Success(run_id=run.pk, attempt=run.attempts, started_at=T0, finished_at=T0)],
            now=clock.now(),
        )
    for worker in ("w3", "w4", "w5"):
        _claim(worker, clock.now(), limit=3)
    assert _live(clock.now()) == CAP // 2
    assert _states(ids)[RunState.RUNNING] == CAP // 2


@pytest.mark.django_db
def test_a_striped_slot_of_a_dead_worker_frees_when_its_lease_expires(striped, clock):
    ids = _add(CAP + 2)
    clock.advance(1)
    assert len(_claim("dead", clock.now(), limit=CAP)) == CAP
    assert _claim("alive", clock.now(), limit=2) == []
    assert _states(ids)[RunState.BLOCKED] == 2
    clock.advance(31)  # the dead worker's leases expired: its holds no longer count
    assert _live(clock.now()) == 0
    limits.sweep(clock.now())  # lets the blocked runs through (a release never came)
    got = []
    for _ in range(4):
        got += _claim("alive", clock.now(), limit=CAP)
    assert _live(clock.now()) == CAP
    assert len(got) == CAP  # recovered leases and the runs let through, never more than the cap


@pytest.mark.django_db
def test_the_next_claim_sends_its_stripe_or_the_whole_limit_with_its_candidates(striped, monkeypatch):
    """A worker whose claim admitted under one stripe tries that stripe again in the round trip
    that reads its next candidates; one whose claim left the limit more than half full locks the
    whole limit there instead (no stripe first, so it never waits for the others while holding one)."""
    if not is_postgres():
        pytest.skip("PostgreSQL's locks")
    sent: list[dict] = []
    real = admission.pick_and_lock

    def spy(pick, *args, **kwargs):
        if pick is not None:  # the pipelines that read candidates (lock_and_count sends none)
            sent.append(kwargs["stripes"])
        return real(pick, *args, **kwargs)

    monkeypatch.setattr(admission, "pick_and_lock", spy)
    ids = _add(CAP + 2)
    now = T0 + timedelta(seconds=1)
    [first] = _claim("w", now)
    stripe = LimitHold.objects.get(run_id=first.pk).stripe
    assert sent == [] and limits._expected["w"][2] == {("wide", ""): stripe}
    [second] = _claim("w", now)  # its stripe's one slot is taken: the whole limit admits it elsewhere
    assert sent == [{("wide", ""): stripe}]
    assert LimitHold.objects.get(run_id=second.pk).stripe != stripe
    taken = _claim("w", now, limit=4)  # 6 of 8 held: more than half full
    assert len(taken) == 4
    assert limits._expected["w"][2] == {("wide", ""): None}
    sent.clear()
    rest = _claim("w", now, limit=4)
    assert sent == [{("wide", ""): None}]
    assert len(rest) == 2 and _live(now) == CAP
    assert _states(ids)[RunState.BLOCKED] == 2


@pytest.mark.django_db
def test_a_prefetching_claim_takes_no_more_than_its_stripes_share_of_limited_runs(settings, monkeypatch):
    """A worker with one task thread prefetches the limited runs after the first only while each
    fits its stripe's share: past it, one would wait prefetched, so it is not worth every other
    stripe's lock, which other workers' claims hold (each waited up to ``CLAIM_LOCK_TIMEOUT_MS`` and
    left the run pending: 4 workers batching 128 runs under a 1,000 cap, whose stripes hold 125,
    drained 252 runs/s against 1,815 at 32). It stays pending for the next claim, which the claim
    does not pick again for (it has its batch). On SQLite nothing is striped: the batch is bounded
    by the half-full rule alone."""
    cap = 64  # 8 stripes of 8 slots; half full at 32
    settings.DISTSCHED = {
        **settings.DISTSCHED,
        "LIMITS": {"wide": {"task": "tests.echo", "concurrency": cap}},
        "LIMIT_STRIPE_MIN_CONCURRENCY": 8,
    }
    limits._expected.clear()
    ids = _add(30)
    now = T0 + timedelta(seconds=1)
    picks = []
    waiting_statement = claiming.claims.waiting_statement
    monkeypatch.setattr(
        claiming.claims, "waiting_statement", lambda **kw: picks.append(kw["limit"]) or waiting_statement(**kw)
    )
    taken = claiming.claim_runs(worker_id="w1", queues=None, lease_seconds=30, now=now, limit=20)
    assert picks == [20]  # one pick: the runs past the stripe's share are not replaced by others
    share = limits.stripe_share(cap, 0) if is_postgres() else 20
    assert len(taken) == share and _live(now) == share
    assert _states(ids) == {RunState.RUNNING: 1, RunState.LEASED: share - 1, RunState.PENDING: 30 - share}
    if is_postgres():  # all in one stripe
        assert len(set(LimitHold.objects.values_list("stripe", flat=True))) == 1
    more = claiming.claim_runs(worker_id="w2", queues=None, lease_seconds=30, now=now, limit=20)
    assert len(more) == min(share, 30 - share)  # another worker's claim: its own stripe's share
    limits._expected.clear()


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_hold_count_reads_each_holds_run_by_its_key_whatever_the_statistics(striped):
    """The count admission makes on every claim looks each hold's run up by its primary key.
    Written as a join, statistics taken while no run was leased (autovacuum off, before a burst)
    made the planner walk every leased run's index entry for each hold: 0.9 ms for 64 holds
    (2,016 rows read and dropped) instead of 0.17 ms, on every claim of the bench's case (b)."""
    from distsched_app.db import holds

    ids = _add(3)
    _claim("w1", T0, limit=3)
    with connections["default"].cursor() as cursor:
        cursor.execute("ANALYZE")  # what the planner knows: a few leased runs and their holds
    for by_key, by_worker, params in ((True, False, ["wide", T0, ""]), (False, True, ["wide", T0, "w1"])):
        sql = holds.live_sql(by_key=by_key, by_worker=by_worker)
        with connections["default"].cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = off")  # tiny tables: the index paths, as on a busy one
            cursor.execute("EXPLAIN " + sql, params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
        assert "SubPlan" in plan and "Index Cond: (id = h.run_id)" in plan, plan
        assert "Join" not in plan and "Nested Loop" not in plan, plan
    assert holds.count_live("wide", T0, key="") == len(ids)
    assert holds.count_live("wide", T0, worker_id="w1") == len(ids)
    assert holds.count_live("wide", T0, worker_id="w2") == 0
    assert holds.count_live("wide", T0 + timedelta(seconds=31), key="") == 0  # their leases expired


@pytest.mark.django_db(transaction=True)
def test_a_claim_counts_its_stripes_live_holds_exactly_and_the_other_stripes_hold_rows(striped, clock):
    """A claim admitting under one stripe's lock looks up the runs of that stripe's holds alone
    (a key lookup a hold, most of a busy limit's count); of the other stripes it takes the hold
    rows, an upper bound. Here every lease has expired: no hold is live, every stripe keeps one
    row. Whether the stripe tried first was free, or another transaction held it and the next
    one was locked instead, the stripe locked counts 0 and every other one 1."""
    if not is_postgres():
        pytest.skip("stripes are PostgreSQL's (SQLite's claim holds the write lock)")
    _add(CAP)
    clock.advance(1)
    assert len(_claim("w1", clock.now(), limit=CAP)) == CAP
    assert Counter(LimitHold.objects.values_list("stripe", flat=True)) == {i: 1 for i in range(admission.STRIPES)}
    later = clock.now() + timedelta(seconds=31)  # every lease expired, no hold deleted yet
    rows = {i: 1 for i in range(admission.STRIPES)}
    other = connections.create_connection("default")
    try:
        other.set_autocommit(False)
        with other.cursor() as cursor:  # stripe 3 locked by another transaction
            cursor.execute("SELECT pg_advisory_xact_lock(%s, 3)", [admission.stripe_lock_key("wide", "")])
        with transaction.atomic():
            taken = admission.lock_and_count("wide", "", later, timeout_ms=200, stripes=True, prefer=3)
    finally:
        other.rollback()
        other.close()
    assert taken is not None and taken.stripe == 4
    assert taken.by_stripe == {**rows, 4: 0}
    with transaction.atomic():
        tried = admission.lock_and_count("wide", "", later, timeout_ms=200, stripes=True, prefer=5)
    assert tried is not None and tried.stripe == 5
    assert tried.by_stripe == {**rows, 5: 0}
    assert limits.in_use("wide", later, key="") == 0
