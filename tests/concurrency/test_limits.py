"""Flow control with real ``runworker`` processes on the real database (both backends).

Every worker gets ``DISTSCHED["LIMITS"]`` through ``DISTSCHED_TEST_LIMITS`` (tests/settings.py);
this process declares the same limits with the ``settings`` fixture (enqueue checks partition
keys, ``set_override`` needs the limit). What each test asserts comes from the runs' own rows:
the worker writes a run's ``started_at`` / ``finished_at`` just around the task call, so they
bound the task body; the body of a limited run lies inside the time it holds its slot
(admitted in a claim that committed before the body starts, released in the transaction that
records the success, after the body ends), so two bodies overlapping means two slots were
held at once. The rate test counts admissions (the ``claimed`` event's time is the claim's
``now``, the instant the rate's GCRA admits at) and reports the body starts too.

The tasks are the test app's: ``tests.record`` (sleeps ``sleep`` seconds) where overlaps must
be possible, ``tests.echo`` (no-op, takes any keyword) where speed matters. ``tests.record``
takes no free keyword, so the per-key test partitions by its ``sleep`` argument.

Every wait is a bounded poll of the database; workers poll every 0.2 s (on PostgreSQL they
are also woken by notifications).
"""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pytest
from django.db import connection
from django.db.models import Count, F

from distsched_app.backoff import RetryPolicy
from distsched_app.models import EventType, LimitAction, LimitEvent, Run, RunEvent, RunState
from distsched_app.services import claiming, limit_overrides, outcomes
from distsched_app.services import limits as limit_service
from distsched_app.services.enqueue import Job, enqueue
from tests.concurrency.procs import child_env, finish, manage, wait_for
from tests.conftest import T0
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BOOT = 90  # seconds a child process may take to start on a loaded machine
POLL = 0.2
WORKER_ARGS = (f"--poll-interval={POLL}",)


# -- plumbing --------------------------------------------------------------------------------------


class Workers:
    """Real ``runworker`` children with the test's LIMITS; output to one log file each."""

    def __init__(self, directory: Path, limits: dict, **env: str) -> None:
        self.directory = directory
        self.env = child_env(DISTSCHED_TEST_LIMITS=json.dumps(limits), **env)
        self.procs: dict[str, subprocess.Popen] = {}
        self.killed: set[str] = set()

    def start(self, count: int, *args: str, prefix: str = "w") -> list[str]:
        names = []
        for i in range(count):
            name = f"{prefix}{len(self.procs)}-{i}"
            with (self.directory / f"{name}.log").open("w") as log:
                self.procs[name] = manage(
                    "runworker", f"--worker-id={name}", *WORKER_ARGS, *args,
                    env=self.env, stdout=log, stderr=subprocess.STDOUT,
                )  # fmt: skip
            names.append(name)
        return names

    def kill(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait(timeout=30)
        self.killed.add(name)

    def logs(self) -> str:
        out = []
        for name in self.procs:
            text = (self.directory / f"{name}.log").read_text(errors="replace")
            out.append(f"--- {name}\n" + "\n".join(text.splitlines()[-15:]))
        return "\n".join(out)

    def stop(self) -> None:
        """SIGTERM every live child; each must exit 0 (the killed ones aside)."""
        live = [p for n, p in self.procs.items() if n not in self.killed]
        for proc in live:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        results = finish(live, timeout=60)
        self.procs = {n: p for n, p in self.procs.items() if n in self.killed}
        bad = [code for code, _, _ in results if code != 0]
        assert not bad, f"worker exit codes {bad}\n{self.logs()}"


@pytest.fixture
def workers(settings, tmp_path) -> Iterator:
    """``workers(limits)``: declares the limits here and returns a ``Workers`` for them."""
    made: list[Workers] = []

    def make(limits: dict, *, stripe_from: int | None = None) -> Workers:
        """``stripe_from``: ``LIMIT_STRIPE_MIN_CONCURRENCY`` here and in the workers."""
        settings.DISTSCHED = {**settings.DISTSCHED, "LIMITS": limits}
        env = {}
        if stripe_from is not None:
            settings.DISTSCHED = {**settings.DISTSCHED, "LIMIT_STRIPE_MIN_CONCURRENCY": stripe_from}
            env["DISTSCHED_TEST_LIMIT_STRIPE_MIN_CONCURRENCY"] = str(stripe_from)
        made.append(Workers(tmp_path, limits, **env))
        return made[-1]

    yield make
    for group in made:  # a failed test's children must not outlive it (nor its database)
        for proc in group.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


def add(task: str, n: int = 1, *, max_attempts: int = 3, **kwargs) -> list[int]:
    policy = RetryPolicy(max_attempts=max_attempts, base=1, cap=1)
    job = Job(task_name=task, kwargs=kwargs)
    return [enqueue(job, now=T0, policy=policy).run.pk for _ in range(n)]  # T0: the real past, so due


def succeeded(ids: list[int]) -> int:
    return Run.objects.filter(pk__in=ids, state=RunState.SUCCEEDED).count()


def wait_succeeded(ids: list[int], group: Workers, timeout: float) -> None:
    ok = wait_for(lambda: succeeded(ids) == len(ids), timeout=timeout, interval=0.2)
    if not ok:
        states = dict(Run.objects.filter(pk__in=ids).order_by().values_list("state").annotate(n=Count("id")))
        pytest.fail(f"{succeeded(ids)}/{len(ids)} succeeded within {timeout:.0f} s; states {states}\n{group.logs()}")


def ts(value: datetime) -> float:
    return value.timestamp()


@dataclass(frozen=True)
class Span:
    run_id: int
    key: str
    start: float  # task body start (Run.started_at)
    end: float  # task body end (Run.finished_at)
    claimed: float  # the admitting claim's now (its ``claimed`` event)

    def overlaps(self, other: Span) -> bool:
        return self.start < other.end and other.start < self.end


def spans(ids: list[int], limit: str = "") -> list[Span]:
    claimed = dict(
        RunEvent.objects.filter(run_id__in=ids, event_type=EventType.CLAIMED)
        .order_by("id")
        .values_list("run_id", "created_at")
    )  # the last claim of each run (the one that ran it)
    rows = Run.objects.filter(pk__in=ids, state=RunState.SUCCEEDED).values_list(
        "id", "started_at", "finished_at", "limit_keys"
    )
    out = [
        Span(pk, (keys or {}).get(limit, ""), ts(start), ts(end), ts(claimed[pk]))
        for pk, start, end, keys in rows
    ]  # fmt: skip
    return sorted(out, key=lambda s: s.start)


def max_overlap(items: list[Span]) -> int:
    """Most bodies running at one instant (an end and a start at the same instant do not overlap)."""
    edges = sorted([(s.start, 1) for s in items] + [(s.end, -1) for s in items])
    best = current = 0
    for _, step in edges:
        current += step
        best = max(best, current)
    return best


def overlapping_at(items: list[Span], at: float) -> int:
    return sum(1 for s in items if s.start <= at < s.end)


def report(text: str) -> None:
    print(f"\n[{connection.vendor}] {text}")


# -- concurrency -----------------------------------------------------------------------------------


def assert_reached_never_exceeded(ids: list[int], cap: int, label: str) -> None:
    """The runs of a concurrency-``cap`` limit never overlapped more than ``cap`` deep, did reach
    it, were blocked at least once (the limit bound) and each ran once."""
    items = spans(ids)
    peak = max_overlap(items)
    report(f"{label}: peak overlap {peak}, {len(items)} runs")
    assert peak <= cap, [s for s in items if overlapping_at(items, s.start) > cap]
    assert peak == cap, "the limit never had all its slots in use"
    assert RunEvent.objects.filter(run_id__in=ids, event_type=EventType.BLOCKED).exists(), "the limit never bound"
    assert Execution.objects.filter(run_id__in=ids).count() == len(ids)  # each ran once


def test_a_global_concurrency_limit_holds_across_four_workers_with_two_threads_each(workers):
    group = workers({"pair": {"task": "tests.record", "concurrency": 2}})
    ids = add("tests.record", 24, sleep=0.15)
    free = add("tests.noop", 20)  # unlimited runs alongside: prefetched and run beside the limited ones
    group.start(4, "--concurrency=2")
    try:
        wait_succeeded(ids + free, group, timeout=BOOT)
    finally:
        group.stop()
    assert_reached_never_exceeded(ids, 2, "concurrency 2, 4 workers x 2 threads")


def test_four_workers_admit_under_a_large_limit_side_by_side_through_its_lock_stripes(workers):
    """A limit of 512 on the task (striped on PostgreSQL: 8 stripes of 64 slots): four workers drain
    its runs, each admitting under a stripe of its own instead of queueing on one row. Sampled
    while they run, the holds show several stripes in use, none over its share; every run runs
    once. (Racing claims at a cap they reach: ``tests/db/test_limit_stripes.py``.)"""
    from distsched_app.db import admission
    from distsched_app.models import LimitHold

    group = workers({"wide": {"task": "tests.record", "concurrency": 512}})
    ids = add("tests.record", 60, sleep=0.05)
    group.start(4, "--concurrency=2")
    seen: set[tuple[str, int]] = set()
    most = 0
    try:
        deadline = time.monotonic() + BOOT
        while succeeded(ids) < len(ids) and time.monotonic() < deadline:
            holds = list(LimitHold.objects.values_list("worker_id", "stripe"))
            seen.update(holds)
            most = max([most, *Counter(stripe for _, stripe in holds).values()])
            time.sleep(0.02)
        wait_succeeded(ids, group, timeout=BOOT)
    finally:
        group.stop()
    stripes = {stripe for _, stripe in seen}
    report(f"limit 512, 4 workers: stripes seen {sorted(stripes)}, most holds in one stripe {most}")
    assert Execution.objects.filter(run_id__in=ids).count() == len(ids)  # each ran once
    assert most <= 512 // admission.STRIPES
    if connection.vendor == "postgresql":
        assert len(stripes) >= 2, seen  # workers admitted under different stripes
    else:
        assert stripes <= {0}  # SQLite's claim holds the write lock: nothing is striped


def test_a_small_striped_limit_holds_across_four_workers_with_two_threads_each_and_is_reached(workers):
    """A limit of 3 striped (``LIMIT_STRIPE_MIN_CONCURRENCY`` lowered to 3 in every process): on
    PostgreSQL its cap is split over the lock stripes (shares 1, 1, 1 and five of 0), so workers
    admit under one stripe each, in one round trip, and go through the whole limit when their
    stripe is taken. Four workers x two threads never run more than 3 bodies at once, do run 3,
    and the limit binds (runs blocked); no stripe ever holds more than its share."""
    from distsched_app.db import admission
    from distsched_app.models import LimitHold
    from distsched_app.services.limit_rules import declared
    from distsched_app.services.limits import stripe_share, striped

    group = workers({"trio": {"task": "tests.record", "concurrency": 3}}, stripe_from=3)
    assert striped(declared()["trio"])
    ids = add("tests.record", 30, sleep=0.15)
    free = add("tests.noop", 20)  # unlimited runs alongside
    group.start(4, "--concurrency=2")
    per_stripe: Counter[int] = Counter()
    try:
        deadline = time.monotonic() + BOOT
        while succeeded(ids) < len(ids) and time.monotonic() < deadline:
            live = Counter(
                LimitHold.objects.filter(run__state__in=["leased", "running"], run__attempts=F("attempt")).values_list(
                    "stripe", flat=True
                )
            )
            for stripe, n in live.items():
                per_stripe[stripe] = max(per_stripe[stripe], n)
            time.sleep(0.02)
        wait_succeeded(ids + free, group, timeout=BOOT)
    finally:
        group.stop()
    assert_reached_never_exceeded(
        ids, 3, f"striped limit 3, 4 workers x 2 threads (most holds per stripe {dict(per_stripe)})"
    )
    if connection.vendor == "postgresql":
        assert all(n <= stripe_share(3, stripe) for stripe, n in per_stripe.items()), per_stripe
        assert set(per_stripe) <= {0, 1, 2} and len(per_stripe) >= 2, per_stripe
        assert admission.STRIPES == 8
    else:
        assert set(per_stripe) <= {0}  # SQLite's claim holds the write lock: nothing is striped


def test_a_per_key_limit_never_overlaps_one_key_but_overlaps_different_keys(workers):
    group = workers({"per-key": {"task": "tests.record", "concurrency": 1, "partition_by": ["sleep"]}})
    ids = []
    for _ in range(8):
        ids += add("tests.record", sleep=0.2) + add("tests.record", sleep=0.3)
    group.start(4, "--concurrency=2")
    try:
        wait_succeeded(ids, group, timeout=BOOT)
    finally:
        group.stop()
    items = spans(ids, "per-key")
    assert {s.key for s in items} == {"0.2", "0.3"}
    for key in ("0.2", "0.3"):
        same = [s for s in items if s.key == key]
        clashes = [(a.run_id, b.run_id) for i, a in enumerate(same) for b in same[i + 1 :] if a.overlaps(b)]
        assert not clashes, f"key {key}: runs overlapped {clashes}"
    across = sum(1 for a in items if a.key == "0.2" for b in items if b.key == "0.3" and a.overlaps(b))
    report(f"per-key concurrency 1: {across} overlapping pairs across the two keys, none within one")
    assert across > 0, "the two keys never ran side by side"


# -- rate ------------------------------------------------------------------------------------------


def test_a_rate_limit_never_admits_more_than_five_in_any_second_and_keeps_up_the_rate(workers):
    group = workers({"five": {"task": "tests.echo", "rate": "5/s"}})
    ids = add("tests.echo", 25)
    group.start(4, "--concurrency=2")
    try:
        wait_succeeded(ids, group, timeout=BOOT)
    finally:
        group.stop()
    items = spans(ids)

    def worst(times: list[float]) -> int:
        times = sorted(times)
        return max(sum(1 for t in times if start <= t < start + 1.0) for start in times)

    admitted = sorted(s.claimed for s in items)
    bodies = sorted(s.start for s in items)
    rate = (len(admitted) - 1) / (admitted[-1] - admitted[0])
    gaps = [b - a for a, b in itertools.pairwise(admitted)]
    report(
        f"rate 5/s: {len(items)} runs over {admitted[-1] - admitted[0]:.2f} s = {rate:.2f}/s; most admissions "
        f"in a 1-s window {worst(admitted)}, body starts {worst(bodies)}; admission gaps "
        f"min {min(gaps) * 1000:.0f} ms, max {max(gaps) * 1000:.0f} ms"
    )
    assert worst(admitted) <= 5
    assert rate >= 3.5
    assert RunEvent.objects.filter(run_id__in=ids, event_type=EventType.THROTTLED).exists(), "the rate never bound"
    assert Run.objects.filter(pk__in=ids).exclude(attempts=1).count() == 0  # throttling uses no attempt


# -- a dead worker's slot ---------------------------------------------------------------------------


def test_a_killed_workers_slot_frees_when_its_lease_expires(workers):
    group = workers({"solo": {"task": "tests.record", "concurrency": 1}})
    lease = ("--lease-seconds=2", "--heartbeat-seconds=0.5")
    group.start(2, *lease)
    [hung] = add("tests.record", max_attempts=1, sleep=60)  # holds the slot until its worker dies
    assert wait_for(lambda: Execution.objects.filter(run_id=hung).exists(), timeout=BOOT), group.logs()
    [waiting] = add("tests.record", sleep=0)
    assert wait_for(
        lambda: Run.objects.filter(pk=waiting, state=RunState.BLOCKED).exists(), timeout=30, interval=0.1
    ), f"the second run was never held back: {Run.objects.get(pk=waiting).state}\n{group.logs()}"
    owner = Run.objects.get(pk=hung).lease_owner
    group.kill(owner)
    expires = Run.objects.get(pk=hung).lease_expires_at  # the dead worker's last renewal: final now
    killed_at = time.time()
    try:
        assert wait_for(lambda: succeeded([waiting]) == 1, timeout=30, interval=0.05), group.logs()
    finally:
        group.stop()
    started = Run.objects.get(pk=waiting).started_at
    delay = ts(started) - ts(expires)
    report(
        f"killed holder's lease expired {ts(expires) - killed_at:.2f} s after the kill; "
        f"the blocked run started {delay:.2f} s after the expiry"
    )
    assert started >= expires, "the slot was given away while the dead worker's lease was live"
    # Lease recovery runs about once a second (worker.loop.EXPIRED_CHECK_SECONDS), the idle
    # worker polls every POLL: a poll or two after that, plus slack for a loaded machine.
    assert delay <= 1.0 + 2 * POLL + 1.5
    assert Run.objects.get(pk=hung).state == RunState.DEAD  # out of attempts: recovered as dead
    assert Run.objects.get(pk=waiting).lease_owner == "" and Execution.objects.get(run_id=waiting).worker_id != owner


# -- fairness --------------------------------------------------------------------------------------


def test_a_fair_total_lets_a_small_partition_through_ahead_of_a_big_backlog(workers):
    """Fairness decides which blocked run a freed slot goes to. A pending run a claim meets while
    the limit has room is admitted in queue order, and no-op runs leave a total of 2 rarely full at
    claim time; so the test starts where fairness matters: the limit saturated (this process holds
    both slots) and the whole backlog blocked behind it, the small partition enqueued last."""
    group = workers({"tenants": {"task": "tests.echo", "total": 2, "fair": True, "partition_by": ["tenant"]}})
    big = add("tests.echo", 200, tenant="big")
    small = add("tests.echo", 10, tenant="small")  # behind the whole big backlog
    now = datetime.now(timezone.utc)
    held = claiming.claim_runs(worker_id="holder", queues=None, lease_seconds=120, now=now, limit=2, start_all=True)
    assert len(held) == 2 and all(r.pk in big for r in held)
    waiting = Run.objects.filter(pk__in=big + small, state=RunState.BLOCKED)
    group.start(2)  # 4 would only queue longer on the limit's row lock
    try:
        assert wait_for(lambda: waiting.count() == len(big) + len(small) - 2, timeout=BOOT, interval=0.1), group.logs()
        done = datetime.now(timezone.utc)
        ends = [outcomes.Success(run_id=r.pk, attempt=r.attempts, started_at=now, finished_at=done) for r in held]
        # Frees both slots: from here on every slot freed goes to the partition admitted least recently.
        outcomes.record_successes(worker_id="holder", successes=ends, now=done)
        wait_succeeded(big + small, group, timeout=BOOT)
    finally:
        group.stop()
    items = [s for s in spans(big + small, "tenants") if s.run_id not in {r.pk for r in held}]
    order = [s.key for s in items]  # by body start
    positions = [i for i, k in enumerate(order) if k == "small"]
    small_end = max(s.end for s in items if s.key == "small")
    big_end = max(s.end for s in items if s.key == "big")
    big_after = sum(1 for s in items if s.key == "big" and s.start > small_end)
    report(
        f"fair total 2, {len(items)} blocked behind it: small partition at start positions {positions}; "
        f"it finished {big_end - small_end:.2f} s before the big one, {big_after} of {len(big) - 2} big runs "
        f"started after it; peak overlap {max_overlap(items)}"
    )
    assert max_overlap(items) <= 2
    # Interleaved (without fair, the older big runs would all go first): at most a few big runs
    # between two small ones (two small ones may start back to back when two slots free before a
    # claim records the first admission), and the small partition is through within its first
    # dozen slots or so.
    between = order[positions[0] : positions[-1] + 1].count("big")
    assert (len(positions) - 1) // 2 <= between <= 3 * len(positions), order[: positions[-1] + 1]
    assert positions[-1] < 40, f"the small partition finished late: {positions}"
    assert big_after >= 0.75 * (len(big) - 2), "the small partition did not finish well before the big one"


# -- overrides -------------------------------------------------------------------------------------


def test_an_override_raises_the_limit_on_the_next_claims_and_expires(workers):
    group = workers({"gate": {"task": "tests.record", "concurrency": 1}})
    ids = add("tests.record", 80, sleep=0.4)
    group.start(4, "--concurrency=2")
    try:
        assert wait_for(lambda: succeeded(ids) >= 3, timeout=BOOT, interval=0.1), group.logs()
        before = time.time()
        change = limit_overrides.set_override(
            "gate", {"concurrency": 3}, now=datetime.now(timezone.utc), by="code:tests", reason="test",
            for_seconds=4,
        )  # fmt: skip
        expiry = ts(change.until)
        running = Run.objects.filter(pk__in=ids, state=RunState.RUNNING)
        assert wait_for(lambda: running.count() >= 3, timeout=10, interval=0.05), "the raised limit was not used"
        # The sweep (every SWEEP_SECONDS in each worker) writes the expiry; admission obeys it at once.
        assert wait_for(
            lambda: LimitEvent.objects.filter(limit="gate", action=LimitAction.EXPIRED).exists(),
            timeout=4 + limit_service.SWEEP_SECONDS + 10,
            interval=0.1,
        ), group.logs()
        expired_event = LimitEvent.objects.get(limit="gate", action=LimitAction.EXPIRED)
        after = RunEvent.objects.filter(run_id__in=ids, event_type=EventType.CLAIMED, created_at__gte=change.until)
        assert wait_for(lambda: after.count() >= 4, timeout=30, interval=0.1), group.logs()
        late_ids = list(after.values_list("run_id", flat=True))
        assert wait_for(lambda: succeeded(late_ids) == len(late_ids), timeout=30, interval=0.1), group.logs()
    finally:
        group.stop()
    items = spans(ids)
    early = [s for s in items if s.start < before]  # bodies begun before the override was set
    during = [s for s in items if before <= s.claimed < expiry]
    late = [s for s in items if s.claimed >= expiry]  # admitted by claims after the expiry
    clash_late = [(s.run_id, [o.run_id for o in items if o.run_id != s.run_id and s.overlaps(o)]) for s in late]
    clash_late = [c for c in clash_late if c[1]]
    report(
        f"override concurrency 1 -> 3 for 4 s: {len(early)} runs before it (most at once "
        f"{max(overlapping_at(items, s.start) for s in early)}), {len(during)} admitted under it, peak overlap "
        f"{max_overlap(items)}, {len(late)} admitted after its expiry; the sweep wrote the expiry "
        f"{expired_event.created_at.timestamp() - expiry:.2f} s after it"
    )
    assert max(overlapping_at(items, s.start) for s in early) == 1
    assert max_overlap(items) == 3
    assert late and not clash_late, f"after the expiry a run overlapped others: {clash_late}"
    assert expired_event.actor == "distsched"
