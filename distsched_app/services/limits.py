"""Flow control in the claim: admission of limited runs, release of their slots, the sweep.

The rules (what a limit is, a run's partition, GCRA) are ``services.limit_rules``; this module
applies them, in the claim's transaction and the transactions that end a holder.

- **Admission** (``Gate``, used by ``claiming.claim_runs`` for every candidate): a run under
  limits starts only if every one admits it. Each limit's partition row (``LimitPartition``;
  and the limit's row for a ``total``) is locked ``FOR UPDATE``, so racing claimers admit into
  one partition one at a time (SQLite's claim already holds the write lock). A claim waits at
  most ``CLAIM_LOCK_TIMEOUT_MS`` for it, then leaves the run pending for its next claim, so no
  lock-order cycle can deadlock. Releases wait for the lock (they must not miss a blocked run),
  and take partitions in name order. Occupancy is counted, under that
  lock, from the runs themselves: the ``LimitHold`` rows of runs still leased or running at
  the admitted attempt with a live lease. A dead worker's slot frees when its lease expires;
  nothing else expires and nothing is a counter.
- **Stripes** (PostgreSQL): a large concurrency cap of an unpartitioned limit (``striped``: at
  least ``DISTSCHED["LIMIT_STRIPE_MIN_CONCURRENCY"]``, 512 by default, and no total, rate,
  per-worker cap or fairness) is
  split over ``db.admission.STRIPES`` lock stripes, stripe i owning ``stripe_share(cap, i)``
  slots (the shares sum to the cap). A claim locks one free stripe (without waiting) instead of
  the partition's row and admits while that stripe's holds are below its share, every stripe
  being within its own (after a lowered cap, the stripes still over theirs send everybody to
  the whole-limit path until they drain). Each hold records its stripe, so every stripe stays
  within its share and the limit within the sum: several workers admit side by side. A run the
  stripe cannot take (its share used up), and anything that blocks a run, takes the partition's
  row and then every stripe (waiting, bounded), counts the whole limit exactly and decides as
  an unstriped limit does, putting the hold in a stripe with room.
- A run a concurrency (or ``total``, or a paused limit) holds back becomes ``blocked``: not
  claimable, so claims never walk past it again; a rate-throttled run stays waiting with its
  ``available_at`` moved to when its rate next admits (so an idle worker sleeps until then).
  Neither uses an attempt; each writes its event once per wait. Unlimited runs behind them are
  claimed by the same claim (no head-of-line blocking).
- **Release** (``release``): the transaction that ends a holder (success, failure, dead,
  cancel, lease recovery, a released prefetch) deletes its holds and lets as many blocked runs
  of the partition through as there are free slots (for a ``fair`` limit, of the partition
  admitted least recently), under the same partition lock, with a notification. The
  **sweep** (``sweep``, every few seconds from each worker) does the same for any partition
  with blocked runs: the safety net for a slot freed by an expired lease or a changed limit.
"""

from __future__ import annotations

import logging
import zlib
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, TypeVar

from django.db import OperationalError, connection, transaction
from django.db.models import Count, F, Q

from ..clock import iso_utc
from ..conf import conf
from ..db import admission, bulk, holds, locks, notify
from ..models import LEASED_STATES, EventType, Limit, LimitHold, LimitPartition, Run, RunState
from . import events
from . import limit_rules as rules

logger = logging.getLogger("distsched.limits")

PREFIX = "limit:"
# At most this many blocked runs are let through by one release of an uncapped partition.
MAX_RELEASE = 1000


def held_by(limit: str, key: str) -> str:
    """``Run.held_by`` of a run waiting on a limit's partition."""
    return f"{PREFIX}{limit}:{key}"


def parse_held_by(value: str) -> tuple[str, str] | None:
    """``(limit, key)`` of a ``held_by`` that names a limit, else None."""
    if not value.startswith(PREFIX):
        return None
    limit, _, key = value[len(PREFIX) :].partition(":")
    return limit, key


def partition_label(key: str) -> str:
    return f" (partition {key!r})" if key else ""


class Verdict(Enum):
    ADMIT = "admit"  # claim it
    LATER = "later"  # leave it waiting, untouched (no free thread for a limited run, or local cap)
    HELD = "held"  # blocked or throttled: its row says so already


def active_overrides(now: datetime) -> dict[str, dict[str, Any]]:
    """Operators' overrides in force at ``now`` (``{limit: numbers}``): one small query."""
    rows = Limit.objects.filter(override__isnull=False).filter(
        Q(override_until__isnull=True) | Q(override_until__gt=now)
    )
    return {name: override for name, override in rows.values_list("name", "override") if override}


def in_use(limit: str, now: datetime, *, key: str | None = None, worker_id: str | None = None) -> int:
    """Runs holding a slot of the limit (of one partition, of one worker): admitted and still
    leased or running at that attempt, with a live lease (``db.holds.count_live``)."""
    return holds.count_live(limit, now, key=key, worker_id=worker_id)


def holders(limit: str, key: str | None, now: datetime) -> list[int]:
    """The runs holding a slot of the limit's partition (None: any partition), oldest first."""
    qs = LimitHold.objects.filter(
        limit=limit, run__state__in=list(LEASED_STATES), run__lease_expires_at__gt=now, run__attempts=F("attempt")
    )
    if key is not None:
        qs = qs.filter(key=key)
    return sorted(qs.values_list("run_id", flat=True))


def _lock_partition(limit: str, key: str) -> LimitPartition:
    """The partition's row, locked until COMMIT (``FOR UPDATE``; created on first use)."""
    qs = locks.row_locked(LimitPartition.objects.filter(limit=limit, key=key))
    row = qs.first()
    if row is None:
        LimitPartition.objects.bulk_create([LimitPartition(limit=limit, key=key)], ignore_conflicts=True)
        row = qs.get()
    return row


def _lock_limit(name: str) -> bool:
    """The limit's own row, locked until COMMIT: admissions under a ``total`` serialise on it."""
    qs = locks.row_locked(Limit.objects.filter(name=name))
    if not list(qs.values_list("name", flat=True)):
        Limit.objects.bulk_create([Limit(name=name)], ignore_conflicts=True)
        list(qs.values_list("name", flat=True))
    return True


# A claim waits this long at most for a partition another transaction holds (PostgreSQL's
# lock_timeout, below its deadlock_timeout of 1 s), then leaves the run for its next claim: claims
# queue briefly behind each other on a hot partition, and a claim that locks partitions in an
# order another transaction does not can never deadlock with it.
CLAIM_LOCK_TIMEOUT_MS = 200
LOCK_NOT_AVAILABLE = "55P03"

T = TypeVar("T")


def _bounded(lock: Callable[[], T]) -> T | None:
    """``lock()`` in a savepoint, None if it timed out waiting (the claim carries on without it)."""
    if not connection.features.has_select_for_update:
        return lock()  # SQLite: the claim holds the write lock; nothing to wait for
    try:
        with transaction.atomic():
            return lock()
    except OperationalError as exc:
        if getattr(exc.__cause__, "sqlstate", None) == LOCK_NOT_AVAILABLE:
            return None
        raise


def _claim_lock_timeout(on: bool) -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            if on:
                cursor.execute(f"SET LOCAL lock_timeout = '{CLAIM_LOCK_TIMEOUT_MS}ms'")
            else:
                cursor.execute("SET LOCAL lock_timeout TO DEFAULT")


# Per worker: the partitions of unpartitioned limits its last claim admitted into (in the order it
# locked them), with the declared limits they were read under. On PostgreSQL its next claim locks and counts them in the
# round trip that reads its candidates (``Gate.pick``), which also carries the BEGIN: a worker
# draining limited runs claims them in two round trips (that one, and the writes with COMMIT), not
# five. A claim that
# admits into none clears it, so a worker whose limited runs are gone stops locking.
# A striped partition's entry says how: the stripe to try first (the one it held), or None for the
# row and every stripe (its last claim found the limit more than half full).
_expected: dict[
    str, tuple[dict[str, rules.LimitSpec], tuple[tuple[str, str], ...], dict[tuple[str, str], int | None]]
] = {}
MAX_EXPECTED_WORKERS = 64  # workers of one process remembered (tests make many)


@dataclass
class _Partition:
    """A partition locked by this claim: its row, and its holders counted once under the lock
    (nobody else can admit into it or release from it until the claim commits)."""

    row: LimitPartition
    used: int
    admitted: int = 0
    dirty: bool = False


def striped(spec: rules.LimitSpec) -> bool:
    """Whether the limit's partition is striped where rows are locked (see the module docstring):
    decided from the declaration alone, so every claim of one deploy agrees."""
    return not spec.partition_by and not spec.fair and _concurrency_only(spec.numbers)


def _concurrency_only(numbers: rules.Numbers) -> bool:
    """A concurrency cap of at least ``LIMIT_STRIPE_MIN_CONCURRENCY`` and nothing else. (Below 8 slots
    some stripes own none: a claim that tries one of those takes the whole-limit path.)"""
    return (
        numbers.concurrency is not None
        and numbers.concurrency >= conf.LIMIT_STRIPE_MIN_CONCURRENCY
        and numbers.total is None
        and numbers.rate is None
        and numbers.local is None
    )


def _splittable(numbers: rules.Numbers) -> bool:
    """Whether these numbers (an override's, perhaps) let a claim admit under one stripe's lock."""
    return _concurrency_only(numbers) and not numbers.paused


def stripe_share(cap: int, stripe: int) -> int:
    """Stripe ``stripe``'s slots of a striped cap: the shares of all stripes sum to ``cap``."""
    return cap // admission.STRIPES + (1 if stripe < cap % admission.STRIPES else 0)


@dataclass
class _Stripes:
    """A striped partition as this claim holds it: one stripe (``one``), or the row and every
    stripe (``one`` None). ``counts``: live holds per stripe, counted after the lock, plus this
    claim's admissions (``mine``); exact for the stripes held."""

    one: int | None
    counts: Counter[int]
    mine: Counter[int]
    cap: int | None = None  # the whole-limit path's cap, read by ``finish``
    over: bool | None = None  # a stripe over its share (a lowered cap), once looked at: only ``one``'s count grows
    share: int | None = None  # ``one``'s share of the cap, once ``over`` was found False


@dataclass
class _Hold:
    """A ``LimitHold`` row this claim writes (a plain object: a model instance per admitted run
    cost more than the row's INSERT)."""

    run_id: int
    limit: str
    key: str
    attempt: int
    worker_id: str
    tight: bool = True
    stripe: int = 0


class Gate:
    """One claim's admission decisions, inside its transaction.

    ``slots`` is how many limited runs the claim may start (the worker's free threads). A
    limited run beyond them would wait prefetched while holding its slot: it is taken only
    while each of its limits is a concurrency cap at most half full after it (so prefetched
    runs can never be what keeps a limit from being reached by running ones), never under a
    rate (a token is spent at admission) or a per-worker cap. Each partition is locked and
    counted once per claim; its new state and the holds are written by ``finish``."""

    def __init__(self, *, now: datetime, worker_id: str, slots: int) -> None:
        self.now = now
        self.worker_id = worker_id
        self.slots = slots
        self.limited: list[int] = []  # ids of limited runs admitted, in order
        # Of those, the ones whose limit is nearly full (or has a total or a rate): their worker
        # writes their outcome at once, so their slot frees now, not with the next batch.
        self.tight: set[int] = set()
        # Runs left pending only because they would wait prefetched and their stripe is full: the
        # claim has its batch of limited runs, so picking again for more is pointless.
        self.spilled = 0
        self.events: list[events.NewEvent] = []
        self._overrides: dict[str, dict[str, Any]] | None = None
        self._partitions: dict[tuple[str, str], _Partition | None] = {}
        self._totals: dict[str, int | None] = {}  # limit -> holders in all partitions (None: locked elsewhere)
        self._local: Counter[str] = Counter()
        self._holds: list[_Hold] = []
        self._again: list[int] = []
        self._bounded = False  # the claim's lock_timeout is set (PostgreSQL)
        self._throttled: Counter[tuple[str, str]] = Counter()
        self._picked = False  # ``pick`` sent its pipeline
        self._stripes: dict[tuple[str, str], _Stripes] = {}
        self._tried: set[tuple[str, str]] = set()  # striped partitions a free stripe was looked for
        # Statements left for the claim to write (the holds' INSERT), set by ``finish``.
        self.writes: list[bulk.Statement] = []
        # Asked for every candidate, fixed for the claim: the database's kind, the limits a
        # (task, queue) is under, each partition's numbers once the overrides were read.
        self._locks_rows = admission.locks_rows()
        self._specs: dict[tuple[str, str], list[rules.LimitSpec]] = {}
        # A (task, queue) under unpartitioned limits only (or none): its runs' pairs, the same for each.
        self._shared: dict[tuple[str, str], list[tuple[rules.LimitSpec, str]]] = {}
        self._numbers: dict[tuple[str, str], rules.Numbers] = {}
        self._split: dict[str, bool] = {}

    def pick(self, statement: tuple[str, Sequence[Any]]) -> list[tuple] | None:
        """The claim's first read of candidates (``statement``: ``db.claims.waiting_statement``),
        sent with the locks and counts of the partitions this worker's previous claim admitted
        into, and the overrides in force (PostgreSQL, ``db.admission.pick_and_lock``): one round
        trip where reading the candidates, then locking what they need, took two. The same
        statements in the same order as a lock taken when a candidate needs it (the count still
        starts after the lock was granted). None where there is nothing to expect: the caller
        reads the candidates itself. A lock not granted in time keeps none of them: they are
        then locked when a candidate needs them, as without an expectation. With nothing to
        expect, a read that opens the claim's transaction still goes through the pipeline, which
        sends the ``BEGIN`` with it (``db.admission``): one round trip fewer."""
        expected = _expected.get(self.worker_id)
        if self._picked or self._partitions or not admission.locks_rows():
            return None
        self._picked = True  # once per claim: a lock not granted in time is not waited for again here
        if expected is None or expected[0] is not rules.declared() or not expected[1]:
            if not admission.begins_transaction():
                return None
            return admission.pick_and_lock(statement, [], self.now, timeout_ms=CLAIM_LOCK_TIMEOUT_MS)[0]
        pairs, stripes = expected[1], expected[2]
        rows, locked = admission.pick_and_lock(
            statement,
            pairs,
            self.now,
            timeout_ms=CLAIM_LOCK_TIMEOUT_MS,
            overrides=self._overrides is None,
            stripes=stripes,
        )
        for pair, got in (locked or {}).items():
            if got.overrides is not None:
                self._overrides = got.overrides
            if pair in stripes:
                self._took_stripes(pair, got, fast=stripes[pair] is not None)
            elif got.partition is not None:  # gone since (pruned): created when a candidate needs it
                self._partitions[pair] = _Partition(got.partition, got.holders)
        return rows

    def _prefer(self, pair: tuple[str, str]) -> int:
        """The stripe a claim tries first: the one this worker's last claim held, else one by its id."""
        expected = _expected.get(self.worker_id)
        prefer = expected[2].get(pair) if expected is not None else None
        return prefer if prefer is not None else zlib.crc32(self.worker_id.encode()) % admission.STRIPES

    def _took_stripes(self, pair: tuple[str, str], got: admission.Locked, *, fast: bool) -> bool:
        """Record a striped lock granted: one stripe (``fast``; False when none was free), or the row
        and every stripe (False when the row is not there yet: created when a candidate needs it)."""
        if fast:
            self._tried.add(pair)
            if got.stripe is None:
                return False
            self._stripes[pair] = _Stripes(got.stripe, Counter(got.by_stripe), Counter())
            return True
        if got.partition is None:
            return False
        mine = self._stripes[pair].mine if pair in self._stripes else Counter()
        self._stripes[pair] = _Stripes(None, Counter(got.by_stripe) + mine, Counter(mine))
        self._partitions[pair] = _Partition(got.partition, got.holders, admitted=sum(mine.values()))
        return True

    def _one_stripe(self, limit: str, key: str, numbers: rules.Numbers) -> _Stripes | None:
        """The stripe of a striped partition this claim admits into under that stripe's lock alone:
        locked (one free stripe, no waiting) on first need; None when the numbers are not split,
        no stripe was free, the claim holds the whole limit already, a stripe is over its share
        (a lowered cap), or this one's share is used up: then the whole limit decides."""
        pair = (limit, key)
        held = self._stripes.get(pair)
        if held is not None and held.one is not None and held.share is not None and held.counts[held.one] < held.share:
            return held  # its stripe, with room (the checks below passed once this claim, and hold)
        if not _splittable(numbers):
            return None
        if pair not in self._stripes and pair not in self._tried:
            read = self._overrides is None
            got = admission.lock_and_count(
                limit,
                key,
                self.now,
                timeout_ms=CLAIM_LOCK_TIMEOUT_MS,
                overrides=read,
                stripes=True,
                prefer=self._prefer(pair),
            )
            if got is not None:
                if got.overrides is not None:
                    self._overrides = got.overrides
                self._took_stripes(pair, got, fast=True)
            self._tried.add(pair)
        held = self._stripes.get(pair)
        if held is None or held.one is None:
            return None
        cap = numbers.concurrency
        assert cap is not None  # noqa: S101 - _splittable
        if held.over is None:
            held.over = any(held.counts[i] > stripe_share(cap, i) for i in held.counts)
        if held.over:
            return None
        held.share = stripe_share(cap, held.one)
        return held if held.counts[held.one] < held.share else None

    def _holds_whole(self, pair: tuple[str, str]) -> bool:
        """This claim holds a striped partition's row and every stripe (``_whole`` granted)."""
        return pair in self._stripes and self._stripes[pair].one is None

    def _whole(self, limit: str, key: str) -> bool:
        """A striped partition's row and every stripe locked (waiting, bounded), its holds counted
        per stripe under them; False if not granted in time."""
        pair = (limit, key)
        if self._holds_whole(pair):
            return True
        got = admission.lock_and_count(
            limit, key, self.now, timeout_ms=CLAIM_LOCK_TIMEOUT_MS, overrides=self._overrides is None, stripes=True
        )
        if got is None:
            return False
        if got.overrides is not None:
            self._overrides = got.overrides
        if got.partition is None:  # first use: the row created and locked (the stripes are held already)
            self._bound_waits()
            row = _bounded(lambda: _lock_partition(limit, key))
            if row is None:
                return False
            got = admission.Locked(row, got.holders, got.overrides, None, got.by_stripe)
        return self._took_stripes(pair, got, fast=False)

    def _whole_stripe(self, pair: tuple[str, str], numbers: rules.Numbers) -> int:
        """The stripe a run admitted by the whole-limit path holds: one with room under a split cap
        (there is one while the limit is below its cap), else the first."""
        held = self._stripes[pair]
        held.cap = numbers.concurrency if _splittable(numbers) else None
        if held.cap is None:
            return 0
        start = self._prefer(pair)
        for step in range(admission.STRIPES):
            i = (start + step) % admission.STRIPES
            if held.counts[i] < stripe_share(held.cap, i):
                return i
        return start

    def _striped(self, spec: rules.LimitSpec) -> bool:
        """``striped(spec)``, once per claim (it reads a setting)."""
        split = self._split.get(spec.name)
        if split is None:
            split = self._split[spec.name] = striped(spec)
        return split

    def _numbers_for(self, spec: rules.LimitSpec, key: str) -> rules.Numbers:
        """The partition's numbers in force for this claim (the overrides are read once per claim)."""
        pair = (spec.name, key)
        numbers = self._numbers.get(pair)
        if numbers is None:
            numbers = self._numbers[pair] = spec.numbers_for(key, self.overrides().get(spec.name))
        return numbers

    def overrides(self) -> dict[str, dict[str, Any]]:
        if self._overrides is None:
            self._overrides = active_overrides(self.now)
        return self._overrides

    def _first_stripe(self, limit: str, key: str) -> None:
        """Where rows are locked: the claim's first partition, striped: one free stripe tried and
        counted by the round trip that also reads the overrides in force."""
        pair = (limit, key)
        got = admission.lock_and_count(
            limit,
            key,
            self.now,
            timeout_ms=CLAIM_LOCK_TIMEOUT_MS,
            overrides=True,
            stripes=True,
            prefer=self._prefer(pair),
        )
        if got is not None and got.overrides is not None:
            self._overrides = got.overrides
        if got is not None:
            self._took_stripes(pair, got, fast=True)
        self._tried.add(pair)

    def _first_lock(self, limit: str, key: str) -> None:
        """Where rows are locked (PostgreSQL): the claim's first partition, locked and counted by
        the round trip that also reads the overrides in force (``db.admission``)."""
        self._partitions[(limit, key)] = self._locked(limit, key, overrides=True)

    def _locked(self, limit: str, key: str, *, overrides: bool = False) -> _Partition | None:
        """PostgreSQL: the partition's row locked (waiting ``CLAIM_LOCK_TIMEOUT_MS`` at most)
        and its holders counted after the lock was granted, one round trip; None if the lock
        was not granted in time."""
        got = admission.lock_and_count(limit, key, self.now, timeout_ms=CLAIM_LOCK_TIMEOUT_MS, overrides=overrides)
        if got is None:
            return None
        if got.overrides is not None:
            self._overrides = got.overrides
        if got.partition is None:  # first use: created, then locked and counted
            return self._counted(limit, key, None)
        return _Partition(got.partition, got.holders)

    def _partition(self, limit: str, key: str, *, stateful: bool) -> _Partition | None:
        """The partition, locked and counted once per claim. Its row is read only where it is a
        lock (PostgreSQL) or holds state this admission needs (a rate's, or fairness's);
        ``stateful`` says the latter. SQLite's claim holds the write lock: no row to lock."""
        if (limit, key) not in self._partitions:
            if admission.locks_rows():
                self._partitions[(limit, key)] = self._locked(limit, key)
            elif stateful:
                self._partitions[(limit, key)] = self._counted(limit, key, _lock_partition(limit, key))
            else:
                self._partitions[(limit, key)] = _Partition(
                    LimitPartition(limit=limit, key=key), in_use(limit, self.now, key=key)
                )
        return self._partitions[(limit, key)]

    def _counted(self, limit: str, key: str, row: LimitPartition | None) -> _Partition | None:
        """The partition's row (None: not there yet, then created and locked, waiting a bounded
        time), and its holders counted by a statement that starts after the lock was granted."""
        if row is None:
            self._bound_waits()
            row = _bounded(lambda: _lock_partition(limit, key))
        return None if row is None else _Partition(row, in_use(limit, self.now, key=key))

    def _total(self, limit: str) -> int | None:
        if limit not in self._totals:
            self._bound_waits()
            locked = _bounded(lambda: _lock_limit(limit))
            self._totals[limit] = in_use(limit, self.now) if locked else None
        return self._totals[limit]

    def _bound_waits(self) -> None:
        if not self._bounded:
            _claim_lock_timeout(True)
            self._bounded = True

    def pairs(self, run: Run) -> list[tuple[rules.LimitSpec, str]]:
        """The (limit, partition) pairs the run is under, its keys computed once and stored."""
        where = (run.task_name, run.queue)
        shared = self._shared.get(where)
        if shared is not None:  # unpartitioned limits only: every such run is in their one partition
            return shared
        specs = self._specs.get(where)
        if specs is None:
            specs = self._specs[where] = rules.applicable(*where)
            if not any(spec.partition_by for spec in specs):
                shared = self._shared[where] = [(spec, "") for spec in specs]
                return shared  # none at all among them: []
        keys = dict(run.limit_keys or {})
        out, changed = [], False
        for spec in specs:
            key: str | None
            if spec.name in keys:
                key = keys[spec.name]
            else:
                try:
                    key = rules.partition_key(spec, run.task_name, run.args, run.kwargs)
                except rules.LimitKeyMissing:
                    key = ""  # reached the claim without its key (made before the limit existed): shared
                except Exception:  # a partition function that raised: shared, and said so
                    logger.exception("partition_by of limit %s failed for run %s; shared partition", spec.name, run.pk)
                    key = ""
                if key is None:
                    continue  # exempt
                if spec.partition_by:  # an unpartitioned limit's key is always "": nothing to keep
                    keys[spec.name], changed = key, True
            out.append((spec, key))
        if changed:
            run.limit_keys = keys
            Run.objects.filter(pk=run.pk).update(limit_keys=keys)
        return out

    def admit(self, run: Run) -> Verdict:
        pairs = self.pairs(run)
        if not pairs:
            return Verdict.ADMIT
        extra = len(self.limited) >= self.slots  # it would wait prefetched
        taken: list[tuple[rules.LimitSpec, str, _Partition, rules.Numbers, int]] = []
        one_stripe: list[tuple[rules.LimitSpec, str, _Stripes]] = []
        roomy = True  # every limit of the run at most half full with it (no rate, no local cap)
        for spec, key in pairs:
            split = self._locks_rows and self._striped(spec)
            if self._overrides is None and self._locks_rows:
                (self._first_stripe if split else self._first_lock)(spec.name, key)
            numbers = self._numbers_for(spec, key)
            if split:
                held = self._one_stripe(spec.name, key, numbers)
                if held is not None:  # admitted under its stripe's lock alone
                    assert held.one is not None and numbers.concurrency is not None  # noqa: S101
                    # Whether it may wait prefetched, and its hold is roomy: the whole limit at most half
                    # full, as far as this claim sees (its own stripe has room for it: checked above).
                    room = _room_to_prefetch(numbers, sum(held.counts.values()), 0)
                    if extra and not room:
                        return Verdict.LATER
                    roomy = roomy and room
                    one_stripe.append((spec, key, held))
                    continue
                if extra and not self._holds_whole((spec.name, key)):
                    # Its stripe is full (or none was free): a run that would only wait prefetched
                    # is left for a later claim rather than waiting for every other stripe's lock,
                    # which the other workers' claims hold (a batch bigger than a stripe's share).
                    self.spilled += 1
                    return Verdict.LATER
                if not self._whole(spec.name, key):
                    return Verdict.LATER
            total_used = self._total(spec.name) if numbers.total is not None else 0  # an override may set one
            stateful = numbers.rate is not None or spec.fair
            partition = self._partition(spec.name, key, stateful=stateful) if total_used is not None else None
            if partition is None or (stateful and partition.row.pk is None):
                return Verdict.LATER
            if numbers.paused:
                return self._block(run, spec, key, f"limit {spec.name} is paused by an operator")
            used = partition.used + partition.admitted
            if numbers.concurrency is not None and used >= numbers.concurrency:
                why = f"limit {spec.name}{partition_label(key)} is full ({used}/{numbers.concurrency} running)"
                return self._block(run, spec, key, why)
            if numbers.total is not None and (total_used or 0) >= numbers.total:
                why = f"limit {spec.name} is full in all partitions ({total_used}/{numbers.total} running)"
                return self._block(run, spec, key, why)
            room = _room_to_prefetch(numbers, used, total_used or 0)
            if extra and not room:
                return Verdict.LATER
            roomy = roomy and room
            if numbers.local is not None:
                mine = in_use(spec.name, self.now, worker_id=self.worker_id) + self._local[spec.name]
                if mine >= numbers.local:
                    return Verdict.LATER  # another worker may take it
            if numbers.rate is not None and not rules.conforms(
                numbers.rate, numbers.burst, partition.row.tat, self.now
            ):
                return self._throttle(run, spec, key, numbers, partition.row)
            taken.append((spec, key, partition, numbers, self._whole_stripe((spec.name, key), numbers) if split else 0))
        for spec, key, held in one_stripe:
            assert held.one is not None  # noqa: S101
            held.counts[held.one] += 1
            held.mine[held.one] += 1
            self._hold(run, spec.name, key, held.one, tight=not roomy)
        for spec, key, partition, numbers, stripe in taken:
            if (spec.name, key) in self._stripes:
                self._stripes[(spec.name, key)].counts[stripe] += 1
                self._stripes[(spec.name, key)].mine[stripe] += 1
            partition.admitted += 1
            # The row's state is read by rates (tat) and fairness (last admission) only.
            partition.dirty = partition.row.pk is not None and (numbers.rate is not None or spec.fair)
            partition.row.last_admitted_at = self.now
            if numbers.rate is not None:
                partition.row.tat = rules.next_tat(numbers.rate, partition.row.tat, self.now)
            if numbers.total is not None:
                self._totals[spec.name] = (self._totals[spec.name] or 0) + 1
            self._local[spec.name] += 1
            self._hold(run, spec.name, key, stripe, tight=not roomy)
        if run.attempts:
            self._again.append(run.pk)  # a retry or a re-run: its earlier attempt's holds are replaced
        self.limited.append(run.pk)
        if not roomy:
            self.tight.add(run.pk)
        return Verdict.ADMIT

    def _hold(self, run: Run, limit: str, key: str, stripe: int, *, tight: bool) -> None:
        """Record the hold this claim writes for ``run``'s next attempt under ``limit``'s ``key``."""
        attempt = run.attempts + 1
        self._holds.append(
            _Hold(
                run_id=run.pk,
                limit=limit,
                key=key,
                attempt=attempt,
                worker_id=self.worker_id,
                tight=tight,
                stripe=stripe,
            )
        )

    def finish(self) -> None:
        """Write what this claim's admissions changed: the partitions' rate state and last
        admission, and the holds (a run's earlier holds replaced). Before the claim commits; the
        partitions' UPDATE and the holds' INSERT are left in ``writes``, for the claim to write
        along its own statements."""
        dirty = [p.row for p in self._partitions.values() if p is not None and p.dirty]
        self.writes = bulk.update_statements(
            LimitPartition,
            "id",
            {
                "id": [row.pk for row in dirty],
                "tat": [row.tat for row in dirty],
                "last_admitted_at": [row.last_admitted_at for row in dirty],
            },
        )
        if self._bounded:
            _claim_lock_timeout(False)
        if admission.locks_rows():
            if len(_expected) >= MAX_EXPECTED_WORKERS and self.worker_id not in _expected:
                _expected.clear()
            declared = rules.declared()
            # Unpartitioned limits only: every run under one shares its partition, while the next
            # claim's runs under a partitioned limit are as likely in other partitions (locking
            # those would hold up the claims that need them, for nothing).
            used = [
                (limit, key)
                for (limit, key), p in self._partitions.items()
                if p is not None
                and p.admitted
                and limit in declared
                and not declared[limit].partition_by
                and (limit, key) not in self._stripes
            ]
            # A striped one: its stripe tried first next time, or the whole limit while more than half full.
            how: dict[tuple[str, str], int | None] = {}
            for pair, held in self._stripes.items():
                if pair[0] in declared and held.mine:
                    hot = held.one is None and (held.cap is None or 2 * sum(held.counts.values()) > held.cap)
                    how[pair] = None if hot else (held.one if held.one is not None else self._prefer(pair))
            _expected[self.worker_id] = (declared, tuple(sorted([*used, *how])), how)
        if self._again:
            LimitHold.objects.filter(run_id__in=self._again).delete()
        if self._holds:  # one INSERT written by db.bulk (bulk_create cost more than the statement)
            self.writes += bulk.insert_statements(
                LimitHold,
                {
                    "run": [h.run_id for h in self._holds],
                    "limit": [h.limit for h in self._holds],
                    "key": [h.key for h in self._holds],
                    "attempt": [h.attempt for h in self._holds],
                    "worker_id": [h.worker_id for h in self._holds],
                    "tight": [h.tight for h in self._holds],
                    "stripe": [h.stripe for h in self._holds],
                },
            )

    def _block(self, run: Run, spec: rules.LimitSpec, key: str, why: str) -> Verdict:
        Run.objects.filter(pk=run.pk).update(
            state=RunState.BLOCKED,
            held_by=held_by(spec.name, key),
            lease_owner="",
            lease_expires_at=None,
            updated_at=self.now,
        )
        self.events.append(
            events.NewEvent(
                run_id=run.pk,
                event_type=EventType.BLOCKED,
                now=self.now,
                attempt=run.attempts,
                message=f"{why}; blocked until a slot frees",
            )
        )
        return Verdict.HELD

    def _throttle(
        self, run: Run, spec: rules.LimitSpec, key: str, numbers: rules.Numbers, partition: LimitPartition
    ) -> Verdict:
        rate = numbers.rate
        assert rate is not None  # noqa: S101 - only called for a limit with a rate
        # Runs of one partition throttled by one claim are spread one interval apart, so they do
        # not all come due (and contend) at the same instant.
        spread = self._throttled[(spec.name, key)]
        self._throttled[(spec.name, key)] += 1
        at = rules.earliest_start(rate, numbers.burst, partition.tat, self.now) + timedelta(
            seconds=spread * rate.interval
        )
        label = held_by(spec.name, key)
        state = run.state if run.state in (RunState.PENDING, RunState.RETRYING) else RunState.PENDING
        Run.objects.filter(pk=run.pk).update(
            state=state, available_at=at, held_by=label, lease_owner="", lease_expires_at=None, updated_at=self.now
        )
        if run.held_by != label:  # once per wait, not once per claim
            self.events.append(
                events.NewEvent(
                    run_id=run.pk,
                    event_type=EventType.THROTTLED,
                    now=self.now,
                    attempt=run.attempts,
                    message=f"rate {rate} of limit {spec.name}{partition_label(key)}: next start at {iso_utc(at)}",
                )
            )
        return Verdict.HELD


def _room_to_prefetch(numbers: rules.Numbers, used: int, total_used: int) -> bool:
    """Whether a limited run may wait prefetched: only under concurrency caps that stay at most
    half full with it, and no rate or per-worker cap."""
    if numbers.rate is not None or numbers.local is not None:
        return False
    caps = [(numbers.concurrency, used), (numbers.total, total_used)]
    bounded = [(cap, n) for cap, n in caps if cap is not None]
    return bool(bounded) and all(n + 1 <= cap // 2 for cap, n in bounded)


# -- release ----------------------------------------------------------------------------------


def release(
    run_ids: Collection[int],
    *,
    now: datetime,
    replaced: Collection[int] = (),
    along: Sequence[bulk.Statement] = (),
) -> list[int]:
    """In the transaction that ended these runs' attempts (they no longer hold a lease): free
    their slots and let blocked runs through; ``replaced`` are those of them with a cancel
    request, whose replacements (overlap=replace) may now start. Returns the runs let through.
    ``along``: the statement that ended them, written with the release (one round trip on
    PostgreSQL), or alone while no limit is declared, when the release needs no query at all
    (none either when no run was replaced)."""
    through: list[int] = []
    if run_ids and rules.declared():
        for freed in holds.release(run_ids, prefix=PREFIX, along=along):  # one statement on PostgreSQL
            # Slots of a limit that was at most half full when they were taken: nothing can be
            # blocked behind them unless it filled up since, and then blocked runs are there to
            # see (the whole limit's: a total, declared or overridden, spans partitions). Only
            # then is the partition locked (a run blocked in the same instant, not yet
            # committed, is the sweep's).
            if freed.tight or freed.blocked:
                through += let_through(freed.limit, freed.key, now=now, at_most=freed.slots)
    else:
        bulk.run_all(along)
    if replaced:
        from . import replacement

        through += replacement.release_replacements(list(replaced), now)
    return through


def _blocked(limit: str, key: str | None = None):
    qs = Run.objects.filter(state=RunState.BLOCKED)
    if key is not None:
        return qs.filter(held_by=held_by(limit, key))
    prefix = f"{PREFIX}{limit}:"
    return qs.filter(held_by__gte=prefix, held_by__lt=prefix[:-1] + ";")


def let_through(limit: str, key: str, *, now: datetime, at_most: int | None = None, sweep: bool = False) -> list[int]:
    """Blocked runs of the limit's partition made pending, as many as its free slots (for a
    ``total``, of the partitions chosen by ``fair`` or by age), under the partition lock.

    A release passes ``at_most``, the slots its runs freed: runs it lets through stay pending
    until claimed, so counting free slots alone would let a later release (or the sweep) through
    more than freed. The ``sweep`` leaves a partition alone for ``SWEEP_SECONDS`` after a release
    let runs through."""
    spec = rules.declared().get(limit)
    order = ("-priority", "available_at", "id")
    if spec is None:  # a limit no longer declared holds nothing back
        return _unblock(
            list(_blocked(limit).order_by(*order)[:MAX_RELEASE]), now, f"limit {limit} is no longer declared"
        )
    override = active_overrides(now).get(limit)
    numbers = spec.numbers_for(key, override)
    if connection.features.has_select_for_update or sweep:  # SQLite: the write lock serialises already
        if numbers.total is not None:
            _lock_limit(limit)
        partition = _lock_partition(limit, key)
        if (
            sweep
            and partition.released_at is not None
            and partition.released_at > now - timedelta(seconds=SWEEP_SECONDS)
        ):
            return []
    # Under the lock (a claim blocks a run only while holding it): nothing blocked, nothing to do.
    if not (_blocked(limit) if numbers.total is not None else _blocked(limit, key)).exists():
        return []
    if numbers.paused:
        return []
    through = _let_through(spec, key, numbers, override, now=now, at_most=at_most)
    if through and not LimitPartition.objects.filter(limit=limit, key=key).update(released_at=now):
        LimitPartition.objects.bulk_create(
            [LimitPartition(limit=limit, key=key, released_at=now)], ignore_conflicts=True
        )
    return through


def _let_through(
    spec: rules.LimitSpec,
    key: str,
    numbers: rules.Numbers,
    override: dict[str, Any] | None,
    *,
    now: datetime,
    at_most: int | None,
) -> list[int]:
    limit, order = spec.name, ("-priority", "available_at", "id")
    if numbers.total is None:
        free = MAX_RELEASE if numbers.concurrency is None else numbers.concurrency - in_use(limit, now, key=key)
        free = free if at_most is None else min(free, at_most)
        if free <= 0:
            return []
        runs = list(_blocked(limit, key).order_by(*order)[:free])
        return _unblock(runs, now, f"a slot of limit {limit}{partition_label(key)} freed")
    free = numbers.total - in_use(limit, now)
    free = free if at_most is None else min(free, at_most)
    if free <= 0:
        return []
    if not spec.fair:  # the oldest blocked runs of the limit whose own partition has room
        runs, used = [], {}
        for run in _blocked(limit).order_by(*order)[:MAX_RELEASE].iterator():
            if len(runs) >= free:
                break
            other = (parse_held_by(run.held_by) or (limit, ""))[1]
            cap = spec.numbers_for(other, override).concurrency
            if other not in used:
                used[other] = in_use(limit, now, key=other)
            if cap is None or used[other] < cap:
                used[other] += 1
                runs.append(run)
        return _unblock(runs, now, f"a slot of limit {limit} freed")
    chosen: list[Run] = []
    partitions = LimitPartition.objects.filter(limit=limit).order_by(F("last_admitted_at").asc(nulls_first=True), "key")
    for other in partitions.values_list("key", flat=True).iterator():
        if len(chosen) >= free:
            break
        cap = spec.numbers_for(other, override).concurrency
        if cap is not None and in_use(limit, now, key=other) >= cap:
            continue
        run = _blocked(limit, other).order_by(*order).first()
        if run is not None:
            chosen.append(run)
    return _unblock(chosen, now, f"a slot of limit {limit} freed (fair: partition admitted least recently)")


def _unblock(runs: list[Run], now: datetime, why: str) -> list[int]:
    if not runs:
        return []
    ids = [r.pk for r in runs]
    Run.objects.filter(pk__in=ids, state=RunState.BLOCKED).update(
        state=RunState.PENDING, held_by="", available_at=now, updated_at=now
    )
    events.record_many(
        events.NewEvent(run_id=r.pk, event_type=EventType.UNBLOCKED, now=now, attempt=r.attempts, message=why)
        for r in runs
    )
    notify.notify(r.queue for r in runs)
    return ids


# -- the sweep ----------------------------------------------------------------------------------


SWEEP_SECONDS = 5.0


def sweep(now: datetime) -> int:
    """Let through whatever a missed release left blocked, end expired overrides, drop holds of
    runs that no longer hold a lease. One transaction per partition; returns runs let through."""
    from . import limit_overrides, replacement

    through = limit_overrides.expire(now)
    labels = list(Run.objects.filter(state=RunState.BLOCKED).order_by().values_list("held_by", flat=True).distinct())
    for label in labels:
        parsed = parse_held_by(label)
        if parsed is None:
            continue
        with transaction.atomic():
            through += len(let_through(*parsed, now=now, sweep=True))
    with transaction.atomic():
        # Holds of runs that no longer hold that attempt's lease (a release missed while no limit
        # was declared): they never count, but would linger.
        stale = ~Q(run__state__in=list(LEASED_STATES)) | ~Q(run__attempts=F("attempt"))
        LimitHold.objects.filter(
            pk__in=list(LimitHold.objects.filter(stale).values_list("pk", flat=True)[:10_000])
        ).delete()
    if any(label.startswith(replacement.HOLDER_PREFIX) for label in labels):  # not a workflow node's
        with transaction.atomic():
            through += replacement.sweep_replacements(now)
    return through


def let_all_through(limit: str, now: datetime) -> int:
    """Every partition of the limit with blocked runs, re-examined (a limit's numbers changed)."""
    keys = set(_blocked(limit).order_by().values_list("held_by", flat=True).distinct())
    count = 0
    for label in sorted(keys):
        parsed = parse_held_by(label)
        if parsed is not None:
            count += len(let_through(*parsed, now=now))
    return count


def blocked_counts() -> dict[str, int]:
    """Blocked runs per limit (one grouped query)."""
    out: Counter[str] = Counter()
    rows = Run.objects.filter(state=RunState.BLOCKED, held_by__startswith=PREFIX).order_by().values_list("held_by")
    for label, n in rows.annotate(n=Count("id")).values_list("held_by", "n"):
        parsed = parse_held_by(label)
        if parsed is not None:
            out[parsed[0]] += n
    return dict(out)
