"""Chaos harness: real workers are SIGKILLed while they drain real runs.

Shared by ``tests/chaos/test_chaos.py`` (small, in CI, on both databases) and
``bench/chaos.py`` (large, on a scratch database). The caller has Django set
up against the database to use, with ``tests.testapp`` installed (the
``tests.record`` task writes one ``Execution`` row per execution).

What runs: ``workers`` ``runworker`` processes with a short lease, ``tickers``
``tick --loop`` processes, ``once`` schedules coming due over ``window``
seconds and a few one-second ``interval`` schedules (paused at the end so the
set of runs is finite). Some tasks sleep, some fail their first attempts.
Every ``kill_every`` seconds a random worker is SIGKILLed and replaced.

What is checked afterwards (``ChaosResult.problems``):

- every run is terminal and succeeded (``max_attempts`` is high on purpose);
- none lost: each once schedule has exactly one run, each interval schedule a
  run for every slot from its start to its final ``next_run_at``;
- no slot generated twice, no attempt executed twice (the fencing token is
  unique per execution);
- executions >= runs, and every execution that neither failed nor succeeded
  (the worker died under it) is followed by a ``lease_expired`` event for that
  attempt: every duplicate execution is explained;
- no zombie write: for every run, the ``succeeded`` event's (worker, attempt)
  is the last ``claimed`` event's (worker, attempt);
- no worker or ticker died unless we killed it, and all exit 0 on SIGTERM.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from django.db import connection

from distsched_app.clock import system_clock
from distsched_app.models import TERMINAL_STATES, EventType, Run, RunEvent, RunState, Schedule
from distsched_app.models import Worker as WorkerRow
from distsched_app.services import schedules as schedule_service
from tests.concurrency.procs import finish, manage, wait_for
from tests.testapp.models import Execution

PREFIX = "chaos-"


@dataclass(frozen=True, kw_only=True)
class ChaosConfig:
    runs: int = 240  # once schedules (one run each)
    interval_schedules: int = 3  # one-second interval schedules, paused at the end of the window
    window: float = 15.0  # seconds over which the once runs come due
    workers: int = 3
    tickers: int = 2
    kill_every: tuple[float, float] = (1.0, 2.0)
    lease: float = 2.0
    heartbeat: float = 0.5
    poll: float = 0.05
    tick_interval: float = 0.2
    max_attempts: int = 50
    timeout: float = 150.0  # for the whole drain, after the window
    seed: int | None = None


@dataclass(kw_only=True)
class ChaosResult:
    config: ChaosConfig
    vendor: str
    seed: int
    elapsed: float = 0.0
    kills: int = 0
    runs: int = 0
    once_runs: int = 0
    interval_runs: int = 0
    states: Counter = field(default_factory=Counter)
    executions: int = 0
    duplicate_executions: int = 0
    lease_expired: int = 0
    lease_lost: int = 0
    failed_attempts: int = 0
    duplicate_slots: int = 0
    zombie_writes: int = 0
    problems: list[str] = field(default_factory=list)
    logs: dict[str, Path] = field(default_factory=dict)

    def summary(self) -> str:
        terminal = sum(n for s, n in self.states.items() if s in TERMINAL_STATES)
        verdict = "OK" if not self.problems else f"FAILED ({len(self.problems)} problem(s))"
        return (
            f"CHAOS db={self.vendor} runs={self.runs} (once={self.once_runs} interval={self.interval_runs}) "
            f"workers={self.config.workers} tickers={self.config.tickers} lease={self.config.lease:g}s "
            f"kills={self.kills} executions={self.executions} duplicate_executions={self.duplicate_executions} "
            f"lease_expired={self.lease_expired} lease_lost={self.lease_lost} "
            f"failed_attempts={self.failed_attempts} terminal={terminal}/{self.runs} "
            f"succeeded={self.states.get(RunState.SUCCEEDED, 0)} dead={self.states.get(RunState.DEAD, 0)} "
            f"duplicate_slots={self.duplicate_slots} zombie_writes={self.zombie_writes} "
            f"seed={self.seed} elapsed={self.elapsed:.1f}s -> {verdict}"
        )

    def log_tails(self, chars: int = 1500) -> str:
        out = []
        for name, path in sorted(self.logs.items()):
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            if "Traceback" in text or "ERROR" in text:
                out.append(f"--- {name} ---\n{text[-chars:]}")
        return "\n".join(out)


class _Fleet:
    """The child processes, their log files, and who we killed."""

    def __init__(self, config: ChaosConfig, log_dir: Path) -> None:
        self.config = config
        self.log_dir = log_dir
        self.workers: dict[str, subprocess.Popen] = {}
        self.tickers: dict[str, subprocess.Popen] = {}
        self.killed: set[str] = set()
        self.logs: dict[str, Path] = {}
        self._serial = 0

    def _spawn(self, name: str, *args: str) -> subprocess.Popen:
        path = self.log_dir / f"{name}.log"
        self.logs[name] = path
        with path.open("w") as log:  # the child keeps its own descriptor
            return manage(*args, stdout=log, stderr=subprocess.STDOUT)

    def start_worker(self) -> str:
        self._serial += 1
        name = f"cw{self._serial}"
        c = self.config
        self.workers[name] = self._spawn(
            name,
            "runworker",
            f"--worker-id={name}",
            f"--lease-seconds={c.lease:g}",
            f"--heartbeat-seconds={c.heartbeat:g}",
            f"--poll-interval={c.poll:g}",
        )
        return name

    def start_ticker(self, index: int) -> None:
        name = f"ticker{index}"
        self.tickers[name] = self._spawn(name, "tick", "--loop", f"--interval={self.config.tick_interval:g}")

    def kill_one(self, rng: random.Random) -> str | None:
        """SIGKILL a random worker, once the whole fleet is up (registered); else None.

        Waiting for the last replacement to boot keeps the fleet from shrinking
        to nothing on a loaded machine, where starting Django takes seconds:
        at most one worker is down at a time, as under a supervisor.
        """
        up = sorted(WorkerRow.objects.filter(worker_id__in=list(self.workers)).values_list("worker_id", flat=True))
        if len(up) < len(self.workers):
            return None
        name = rng.choice(up)
        proc = self.workers.pop(name)
        try:
            proc.send_signal(signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
        self.killed.add(name)
        return name

    def unexpected_exits(self) -> list[str]:
        return [
            f"{name} exited on its own with code {p.returncode}"
            for name, p in {**self.workers, **self.tickers}.items()
            if p.poll() is not None
        ]

    def stop_all(self) -> list[str]:
        # A worker SIGTERMed while still importing Django dies of the default
        # handler (-15): wait until each one has registered (handlers installed).
        wait_for(
            lambda: WorkerRow.objects.filter(worker_id__in=list(self.workers)).count() == len(self.workers), timeout=90
        )
        procs = {**self.workers, **self.tickers}
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        results = finish(list(procs.values()), timeout=60)
        return [
            f"{name} exited with code {code} after SIGTERM"
            for name, (code, _, _) in zip(procs, results, strict=True)
            if code != 0
        ]

    def kill_all(self) -> None:
        for p in {**self.workers, **self.tickers}.values():
            if p.poll() is None:
                p.kill()
                p.wait()


def _create_schedules(config: ChaosConfig, rng: random.Random, start) -> None:
    """Once schedules spread over the window; some sleep, some fail their first attempts."""
    now = system_clock.now()
    common = {
        "task_name": "tests.record",
        "max_attempts": config.max_attempts,
        "retry_base_seconds": 0.1,
        "retry_max_seconds": 0.5,
    }
    for i in range(config.runs):
        roll = rng.random()
        kwargs: dict = {}
        if roll < 0.3:
            kwargs["sleep"] = round(rng.uniform(0.02, 0.2), 3)
        elif roll < 0.4:
            kwargs["sleep"] = round(rng.uniform(0.3, 1.0), 3)
        fail = rng.random()
        if fail < 0.15:
            kwargs["fail_attempts"] = 1
        elif fail < 0.2:
            kwargs["fail_attempts"] = 2
        run_at = start + timedelta(seconds=config.window * i / max(config.runs, 1))
        schedule_service.create_schedule(name=f"{PREFIX}once-{i}", run_at=run_at, kwargs=kwargs, now=now, **common)
    for i in range(config.interval_schedules):
        schedule_service.create_schedule(
            name=f"{PREFIX}every-{i}",
            interval_seconds=1,
            start_at=start,
            catch_up="all",
            kwargs={"sleep": 0.05, "fail_attempts": 1 if i == 0 else 0},
            now=now,
            **common,
        )


def _pending_work() -> int:
    """Runs not yet terminal plus once schedules not yet generated."""
    runs = Run.objects.filter(schedule__name__startswith=PREFIX).exclude(state__in=TERMINAL_STATES).count()
    ungenerated = Schedule.objects.filter(name__startswith=f"{PREFIX}once-", next_run_at__isnull=False).count()
    return runs + ungenerated


def run_chaos(config: ChaosConfig, log_dir: Path, say: Callable[[str], None] = lambda _: None) -> ChaosResult:
    seed = config.seed if config.seed is not None else int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    result = ChaosResult(config=config, vendor=connection.vendor, seed=seed)
    log_dir.mkdir(parents=True, exist_ok=True)
    # Give the first processes time to boot before anything is due.
    start = system_clock.now() + timedelta(seconds=3)
    _create_schedules(config, rng, start)
    say(f"chaos: {config.runs} once + {config.interval_schedules} interval schedules created (seed={seed})")

    fleet = _Fleet(config, log_dir)
    began = time.monotonic()
    window_end = began + 3 + config.window
    deadline = window_end + config.timeout
    try:
        for i in range(config.tickers):
            fleet.start_ticker(i)
        for _ in range(config.workers):
            fleet.start_worker()
        next_kill = time.monotonic() + rng.uniform(*config.kill_every)
        paused = False
        while True:
            now = time.monotonic()
            crashed = fleet.unexpected_exits()
            if crashed:
                result.problems.extend(crashed)
                break
            if now >= next_kill:
                victim = fleet.kill_one(rng)
                if victim is not None:
                    result.kills += 1
                    fleet.start_worker()
                    next_kill = now + rng.uniform(*config.kill_every)
                    say(f"chaos: killed {victim} (kill #{result.kills}), {_pending_work()} runs to go")
            if not paused and now >= window_end:
                for i in range(config.interval_schedules):
                    schedule_service.pause_schedule(f"{PREFIX}every-{i}", now=system_clock.now())
                paused = True
            if paused and _pending_work() == 0:
                break
            if now > deadline:
                result.problems.append(f"not drained after {config.timeout:.0f}s: {_pending_work()} runs to go")
                break
            time.sleep(0.2)  # the chaos cadence, not a synchronisation
        result.problems.extend(fleet.stop_all())
    finally:
        fleet.kill_all()
        result.elapsed = time.monotonic() - began
        result.logs = dict(fleet.logs)
    _check(result, fleet.killed)
    return result


def _check(result: ChaosResult, killed: set[str]) -> None:
    problems = result.problems
    runs = list(
        Run.objects.filter(schedule__name__startswith=PREFIX).values(
            "id", "schedule_id", "schedule__name", "scheduled_for", "state", "attempts"
        )
    )
    run_ids = {r["id"] for r in runs}
    result.runs = len(runs)
    result.once_runs = sum(1 for r in runs if r["schedule__name"].startswith(f"{PREFIX}once-"))
    result.interval_runs = result.runs - result.once_runs
    result.states = Counter(r["state"] for r in runs)

    # Every run terminal; with 50 attempts and 0.1 s backoff every one succeeds.
    not_done = [r["id"] for r in runs if r["state"] != RunState.SUCCEEDED]
    if not_done:
        problems.append(f"{len(not_done)} run(s) not succeeded: states {dict(result.states)}, e.g. {not_done[:5]}")

    # None lost: one run per once schedule, every interval slot up to next_run_at.
    per_schedule: dict[str, list] = defaultdict(list)
    for r in runs:
        per_schedule[r["schedule__name"]].append(r["scheduled_for"])
    lost = []
    for s in Schedule.objects.filter(name__startswith=PREFIX):
        slots = sorted(per_schedule.get(s.name, []))
        if s.kind == "once":
            if len(slots) != 1 or s.next_run_at is not None:
                lost.append(f"{s.name}: {len(slots)} run(s), next_run_at={s.next_run_at}")
        else:
            expected = int((s.next_run_at - s.start_at).total_seconds() // s.interval_seconds)
            want = [s.start_at + timedelta(seconds=k * s.interval_seconds) for k in range(expected)]
            if slots != want:
                lost.append(f"{s.name}: {len(slots)} slot(s) generated, {expected} expected up to next_run_at")
    if lost:
        problems.append(f"{len(lost)} schedule(s) with missing or extra runs, e.g. {lost[:3]}")

    # No slot generated twice (the database constraint; checked anyway).
    slots = Counter((r["schedule_id"], r["scheduled_for"]) for r in runs)
    result.duplicate_slots = sum(n - 1 for n in slots.values() if n > 1)
    if result.duplicate_slots:
        problems.append(f"{result.duplicate_slots} slot(s) generated twice")

    executions = list(Execution.objects.filter(run_id__in=run_ids).values_list("run_id", "attempt", "worker_id"))
    result.executions = len(executions)
    per_attempt = Counter((run_id, attempt) for run_id, attempt, _ in executions)
    twice = [key for key, n in per_attempt.items() if n > 1]
    if twice:
        problems.append(f"{len(twice)} attempt(s) executed twice (double claim), e.g. {twice[:5]}")
    never = run_ids - {run_id for run_id, _, _ in executions}
    if never:
        problems.append(f"{len(never)} run(s) never executed, e.g. {sorted(never)[:5]}")

    events: dict[int, list[tuple[str, str, int]]] = defaultdict(list)
    for run_id, kind, worker_id, attempt in (
        RunEvent.objects.filter(run_id__in=run_ids)
        .order_by("id")
        .values_list("run_id", "event_type", "worker_id", "attempt")
    ):
        events[run_id].append((kind, worker_id, attempt))

    executed_attempts: dict[int, set[int]] = defaultdict(set)
    for run_id, attempt, _ in executions:
        executed_attempts[run_id].add(attempt)
    unexplained = []
    # Only finished runs: an unfinished one (already a problem) may be mid-execution.
    for run_id in (r["id"] for r in runs if r["state"] in TERMINAL_STATES):
        history = events[run_id]
        failed = {a for k, _, a in history if k == EventType.FAILED}
        expired = {a for k, _, a in history if k == EventType.LEASE_EXPIRED}
        succeeded = [(w, a) for k, w, a in history if k == EventType.SUCCEEDED]
        claims = [(w, a) for k, w, a in history if k == EventType.CLAIMED]
        result.failed_attempts += len(failed)
        result.lease_expired += len(expired)
        result.lease_lost += sum(1 for k, _, _ in history if k == EventType.LEASE_LOST)
        done = {a for _, a in succeeded}
        extra = executed_attempts[run_id] - failed - done
        result.duplicate_executions += len(extra)
        unexplained += [(run_id, a) for a in extra if a not in expired]
        # No zombie write: the success was recorded by the holder of the last claim.
        if len(succeeded) > 1 or (succeeded and (not claims or succeeded[0] != claims[-1])):
            result.zombie_writes += 1
    if unexplained:
        problems.append(f"{len(unexplained)} re-execution(s) without a lease_expired event, e.g. {unexplained[:5]}")
    if result.zombie_writes:
        problems.append(f"{result.zombie_writes} run(s) whose success was written by a worker without the lease")

    for name, path in result.logs.items():
        text = path.read_text(errors="replace") if path.exists() else ""
        if "Traceback" in text:
            problems.append(f"{name} logged a traceback{' (before it was killed)' if name in killed else ''}")
