"""The worker runtime: claim, execute outside any transaction, record, repeat.

Throughput comes from amortising transactions, not from weakening them: a
worker claims a small batch of runs in one transaction (each run with its own
lease and attempt, so its own fencing token) and records successes in one
fenced transaction per batch. A heartbeat thread keeps the worker row fresh
and renews the lease of every run the worker holds, so a long task is never
re-claimed while its worker is alive; if the process dies, the lease
deadline, not the heartbeat, decides when another worker may take the runs.
Database errors (locked, connection lost) are logged and retried with
backoff: they never kill the worker.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, close_old_connections, connection

from .clock import Clock, SystemClock, current_clock
from .conf import RANGES, conf
from .context import RunContext
from .errors import RunCancelled
from .models import Run, RunState, WorkerStatus
from .registry import TaskRegistry
from .registry import registry as default_registry
from .services import claiming, outcomes, workers
from .services import runs as run_service
from .services import tick as tick_service
from .services.validation import bounded_float, bounded_int, validate_queue, validate_worker_id
from .text import storable

logger = logging.getLogger("distsched")

TRANSIENT_DB_ERRORS = (OperationalError, InterfaceError)
MAX_DB_BACKOFF_SECONDS = 30.0
# Prefetch only while tasks are quick: a slow task would hold prefetched runs
# that idle workers could be running.
FAST_TASK_SECONDS = 0.05
# How often the lease-recovery query runs (it need not run on every claim).
EXPIRED_CHECK_SECONDS = 1.0
# An idle worker expects another process to tick a due slot within this long,
# and polls for its run every TICKER_POLL_SECONDS meanwhile.
TICKER_GRACE_SECONDS = 2.0
TICKER_POLL_SECONDS = 0.02


@dataclass(frozen=True, kw_only=True)
class Execution:
    """What happened to one claimed run in this worker."""

    run_id: int
    attempt: int
    state: str | None  # the recorded state; None if the lease was lost or recording failed
    duration: float
    error: str = ""


@dataclass(kw_only=True)
class _Attempt:
    """A run this worker holds, from claim until its outcome is recorded."""

    run: Run
    started_recorded: bool
    started_at: datetime | None = None
    started_mono: float = 0.0
    finished_at: datetime | None = None
    duration: float = 0.0
    failed: bool = False
    cancelled: bool = False
    error: str = ""
    tb: str = ""
    result: Any = None


def default_worker_id() -> str:
    # A hostname may hold anything and be up to 253 characters: keep the id storable and short.
    host = storable(socket.gethostname()).replace(" ", "_")[:150] or "host"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def describe_exception(exc: BaseException) -> str:
    """``Type: message`` even for exceptions whose ``str()`` raises."""
    name = type(exc).__name__
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not break the worker
        text = "<unprintable exception>"
    return f"{name}: {text}" if text else name


def format_traceback(exc: BaseException) -> str:
    try:
        return "".join(traceback.format_exception(exc))
    except Exception:  # noqa: BLE001
        return f"<traceback unavailable for {type(exc).__name__}>"


MAX_CONCURRENCY = 256


def _option(value: float | None, setting: str, field: str) -> float:
    """A worker option, or its setting's value, within the setting's range (``conf.RANGES``)."""
    kind, low, high = RANGES[setting]
    chosen = getattr(conf, setting) if value is None else value
    if kind is int:
        return bounded_int(chosen, field=field, low=int(low), high=int(high))
    return bounded_float(chosen, field=field, low=low, high=high)


class _NotRecorded(Exception):
    """An outcome service failed for good; ``transient`` if the database stayed unreachable."""

    def __init__(self, error: BaseException, *, transient: bool) -> None:
        super().__init__(describe_exception(error))
        self.transient = transient


class Worker:
    """Executes runs from the given queues. ``run_once()`` or ``run()``."""

    def __init__(
        self,
        *,
        worker_id: str | None = None,
        queues: Sequence[str] | None = None,
        lease_seconds: float | None = None,
        poll_interval: float | None = None,
        heartbeat_seconds: float | None = None,
        with_tick: bool = False,
        prefetch: int | None = None,
        concurrency: int = 1,
        clock: Clock | None = None,
        registry: TaskRegistry | None = None,
    ) -> None:
        # Checked here, with typed errors: a bad option must fail the start, not the loop.
        self.worker_id = validate_worker_id(worker_id) if worker_id else default_worker_id()
        self.queues = [validate_queue(q, field="queues") for q in queues] if queues else ["default"]
        self.lease_seconds = _option(lease_seconds, "LEASE_SECONDS", "lease_seconds")
        self.poll_interval = _option(poll_interval, "POLL_INTERVAL", "poll_interval")
        self.heartbeat_seconds = _option(heartbeat_seconds, "HEARTBEAT_SECONDS", "heartbeat_seconds")
        self.with_tick = with_tick
        self.prefetch = int(_option(prefetch, "PREFETCH", "prefetch"))
        self.concurrency = bounded_int(concurrency, field="concurrency", low=1, high=MAX_CONCURRENCY)
        self.clock = clock or current_clock()
        self.registry = registry or default_registry
        self.executed = 0
        self._registered = False
        self._stop = threading.Event()
        self._hard_stop = False
        self._lock = threading.Lock()
        # Serialises the heartbeat's lease renewal with outcome recording, so a
        # run recorded a moment ago is never mistaken for a lost lease.
        self._record_lock = threading.RLock()
        self._held: dict[int, _Attempt] = {}  # claimed and not yet recorded
        self._executing: set[int] = set()
        self._cancelled: set[int] = set()
        self._lost: set[int] = set()
        self._pending_successes: list[_Attempt] = []
        self._first_pending_at = 0.0
        self._heartbeat_thread: threading.Thread | None = None
        self._heartbeat_stop = threading.Event()
        self._next_tick = 0.0
        self._next_expired_check = 0.0
        self._avg_duration: float | None = None

    # -- lifecycle ---------------------------------------------------------------

    def register(self) -> None:
        workers.register_worker(
            worker_id=self.worker_id, hostname=socket.gethostname(), pid=os.getpid(),
            queues=self.queues, now=self.clock.now(),
        )
        self._registered = True
        self._log(logging.INFO, "worker started", queues=",".join(self.queues), lease=self.lease_seconds,
                  prefetch=self.prefetch, concurrency=self.concurrency)
        skew = self.check_clock_skew()
        if skew is not None:
            workers.heartbeat(worker_id=self.worker_id, now=self.clock.now(), clock_skew_seconds=skew)

    def check_clock_skew(self) -> float | None:
        """Compare this machine's clock with the database's (PostgreSQL); warn past the limit."""
        if not isinstance(self.clock, SystemClock):
            return None  # an injected clock is the test's business
        skew = workers.measure_clock_skew()
        if skew is not None and abs(skew) > conf.MAX_CLOCK_SKEW_SECONDS:
            self._log(logging.WARNING, "clock skew with the database exceeds MAX_CLOCK_SKEW_SECONDS",
                      skew_seconds=f"{skew:.3f}", limit=conf.MAX_CLOCK_SKEW_SECONDS)
        return skew

    def request_stop(self) -> None:
        """Finish the current run(s), claim nothing more. Safe from a signal handler."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def heartbeat(self) -> None:
        """Refresh the worker row; renew the lease of every run held (fenced);
        show a prefetched run that has been executing for a while as running."""
        with self._record_lock:
            self._heartbeat()

    def _heartbeat(self) -> None:
        now = self.clock.now()
        with self._lock:
            held = {run_id: a.run.attempts for run_id, a in self._held.items()}
            executing = [self._held[r] for r in self._executing if r in self._held]
        status = WorkerStatus.STOPPING if self._stop.is_set() else None
        alive = workers.heartbeat(
            worker_id=self.worker_id, now=now, status=status,
            current_run_id=executing[0].run.pk if executing else None, runs_executed=self.executed,
            clock_skew_seconds=self.check_clock_skew(),
        )
        if not alive:
            self.register()
        if not held:
            return
        try:
            renewal = outcomes.renew_leases(worker_id=self.worker_id, held=held, now=now,
                                            lease_seconds=self.lease_seconds)
        except Exception as exc:  # noqa: BLE001 - the next heartbeat tries again; expiry is the backstop
            self._log(logging.WARNING, "could not renew leases", run_id=",".join(map(str, sorted(held))),
                      error=describe_exception(exc))
            if isinstance(exc, TRANSIENT_DB_ERRORS):
                self._reset_connection()
            return
        lost = set(held) - renewal.held
        with self._lock:
            for run_id in lost - self._lost:
                self._log(logging.WARNING, "lease lost while holding run", run_id=run_id, attempt=held[run_id])
            self._lost |= lost
            self._cancelled |= renewal.cancel_requested
        for attempt in executing:
            if not attempt.started_recorded and attempt.started_at is not None:
                try:
                    marked = outcomes.mark_running(run_id=attempt.run.pk, worker_id=self.worker_id,
                                                   attempt=attempt.run.attempts, started_at=attempt.started_at,
                                                   now=now)
                except Exception as exc:  # noqa: BLE001 - the success or failure records the start anyway
                    self._log(logging.WARNING, "could not mark run as running", run_id=attempt.run.pk,
                              error=describe_exception(exc))
                    marked = False
                if marked:
                    attempt.started_recorded = True

    # -- one run -----------------------------------------------------------------

    def run_once(self) -> Execution | None:
        """Claim and execute at most one due run; None when nothing is due."""
        if not self._registered:
            self.register()
        with self._heartbeat_running():
            self._maybe_tick(force=True)
            batch = self._claim(1, force_expired=True)
            if not batch:
                return None
            attempt = self._hold(batch)[0]
            self._run_task(attempt)
            return self._finish(attempt, flush=True)

    def execute(self, run: Run) -> Execution:
        """Execute a run this worker has just claimed, and record its outcome."""
        attempt = self._hold([run])[0]
        self._run_task(attempt)
        return self._finish(attempt, flush=True)

    def _claim(self, limit: int, *, force_expired: bool = False, start_all: bool = False) -> list[Run]:
        check_expired = force_expired or time.monotonic() >= self._next_expired_check
        runs = claiming.claim_runs(
            worker_id=self.worker_id, queues=self.queues, lease_seconds=self.lease_seconds,
            now=self.clock.now(), limit=limit, include_expired=check_expired, start_all=start_all,
        )
        if check_expired:
            self._next_expired_check = time.monotonic() + EXPIRED_CHECK_SECONDS
        if not check_expired and len(runs) < limit:
            self._next_expired_check = 0.0  # idle soon: look for abandoned runs on the next claim
        return runs

    def _hold(self, runs: list[Run]) -> list[_Attempt]:
        attempts = [_Attempt(run=r, started_recorded=r.state == RunState.RUNNING) for r in runs]
        with self._lock:
            for a in attempts:
                self._held[a.run.pk] = a
                if a.run.cancel_requested:
                    self._cancelled.add(a.run.pk)
        return attempts

    def _batch_size(self, remaining: int | None) -> int:
        size = self.prefetch if self._avg_duration is not None and self._avg_duration < FAST_TASK_SECONDS else 1
        return max(1, min(size, remaining)) if remaining is not None else size

    def _maybe_tick(self, force: bool = False) -> None:
        if not self.with_tick:
            return
        if not force and time.monotonic() < self._next_tick:
            return
        self._next_tick = time.monotonic() + self.poll_interval
        tick_service.tick(now=self.clock.now())

    def _run_task(self, attempt: _Attempt) -> None:
        """Call the task outside any transaction; never raises."""
        run = attempt.run
        run_id = run.pk
        with self._lock:
            self._executing.add(run_id)
            cancelled_before_start = run_id in self._cancelled
        attempt.started_at = self.clock.now()
        attempt.started_mono = time.monotonic()
        if cancelled_before_start and not attempt.started_recorded:
            attempt.failed, attempt.cancelled = True, True
            attempt.error = "cancel requested before the run started"
        else:
            context = RunContext(
                run_id=run_id, schedule_id=run.schedule_id, schedule_name=run.schedule.name,
                worker_id=self.worker_id, scheduled_for=run.scheduled_for, attempt=run.attempts,
                idempotency_key=run.idempotency_key, _cancel_probe=self._cancel_probe(run_id),
            )
            try:
                entry = self.registry.get(run.task_name)
                kwargs = dict(run.kwargs)
                if entry.accepts_context:
                    kwargs["context"] = context
                attempt.result = entry.func(*run.args, **kwargs)
            except RunCancelled as exc:
                attempt.failed, attempt.cancelled, attempt.error = True, True, describe_exception(exc)
            except BaseException as exc:  # noqa: BLE001 - SystemExit/KeyboardInterrupt from task code fail the run
                attempt.failed, attempt.error, attempt.tb = True, describe_exception(exc), format_traceback(exc)
        attempt.duration = time.monotonic() - attempt.started_mono
        attempt.finished_at = self.clock.now()
        with self._lock:
            self._executing.discard(run_id)
            self.executed += 1
            avg = self._avg_duration
            self._avg_duration = attempt.duration if avg is None else 0.8 * avg + 0.2 * attempt.duration

    def _finish(self, attempt: _Attempt, *, flush: bool) -> Execution:
        """Record a failure at once; buffer a success (flushed per batch)."""
        run = attempt.run
        if attempt.failed:
            with self._record_lock:
                try:
                    state = self._record(
                        outcomes.record_failure, runs={run.pk: run.attempts}, outcome="failed", run_id=run.pk,
                        worker_id=self.worker_id, attempt=run.attempts, error=attempt.error,
                        traceback_text=attempt.tb, cancelled=attempt.cancelled, started_at=attempt.started_at,
                        record_started=not attempt.started_recorded,
                    )
                    label = state or "lease_lost"
                except _NotRecorded:
                    state, label = None, "unrecorded"
                self._release_hold(run.pk)
            self._log_finished(attempt, state, label)
            return Execution(run_id=run.pk, attempt=run.attempts, state=state, duration=attempt.duration,
                             error=attempt.error)
        with self._lock:
            if not self._pending_successes:
                self._first_pending_at = time.monotonic()
            self._pending_successes.append(attempt)
        state = RunState.SUCCEEDED.value
        if flush:
            lost = self.flush()
            state = None if lost is None or run.pk in lost else state
        return Execution(run_id=run.pk, attempt=run.attempts, state=state, duration=attempt.duration)

    def flush(self) -> set[int] | None:
        """Record buffered successes in one transaction. Returns the ids not recorded as
        succeeded (lease lost, or not recordable: lease expiry recovers those), or None
        if the database could not be reached at all."""
        with self._lock:
            pending, self._pending_successes = self._pending_successes, []
            cancelled = set(self._cancelled)
        if not pending:
            return set()
        successes = [
            outcomes.Success(
                run_id=a.run.pk, attempt=a.run.attempts, started_at=a.started_at, finished_at=a.finished_at,
                result=a.result, record_started=not a.started_recorded,
                note="returned normally after a cancel request" if a.run.pk in cancelled else "",
            )
            for a in pending
        ]
        unrecorded: set[int] = set()
        with self._record_lock:
            try:
                lost = self._record_successes(successes)
            except _NotRecorded:
                lost = None
            else:
                unrecorded = {s.run_id for s in successes} - lost if lost is not None else set()
            for a in pending:
                self._release_hold(a.run.pk)
        for a in pending:
            if lost is None or a.run.pk in lost:
                label = "unrecorded" if lost is None or a.run.pk in unrecorded else "lease_lost"
                self._log_finished(a, None, label)
            else:
                self._log_finished(a, RunState.SUCCEEDED.value)
        return lost

    def _record_successes(self, successes: list[outcomes.Success]) -> set[int]:
        """The batch in one transaction; if it cannot be recorded for a reason other than an
        unreachable database, one transaction per run, so one bad success does not cost the others.

        Returns the ids not recorded as succeeded: a run whose lease was lost is in it, and so
        is one that could not be recorded (it gets a ``record_failed`` note where possible).
        """
        held = {s.run_id: s.attempt for s in successes}
        try:
            return self._record(outcomes.record_successes, runs=held, outcome="succeeded",
                                worker_id=self.worker_id, successes=successes, note_failure=len(successes) == 1)
        except _NotRecorded as exc:
            if exc.transient or len(successes) == 1:
                raise
        lost: set[int] = set()
        for success in successes:
            try:
                lost |= self._record(outcomes.record_successes, runs={success.run_id: success.attempt},
                                     outcome="succeeded", worker_id=self.worker_id, successes=[success])
            except _NotRecorded:
                lost.add(success.run_id)
        return lost

    def _flush_due(self) -> bool:
        with self._lock:
            n = len(self._pending_successes)
        return n >= self.prefetch or (n > 0 and time.monotonic() - self._first_pending_at >= 0.5)

    def _release_hold(self, run_id: int) -> None:
        with self._lock:
            self._held.pop(run_id, None)
            self._cancelled.discard(run_id)
            self._lost.discard(run_id)

    def _release_unstarted(self, attempts: list[_Attempt]) -> None:
        held = {a.run.pk: a.run.attempts for a in attempts}
        if held:
            with self._record_lock:
                try:
                    self._record(outcomes.release_runs, runs=held, outcome="released", note_failure=False,
                                 worker_id=self.worker_id, held=held)
                except _NotRecorded:
                    pass  # still leased to us: lease expiry hands them to another worker
                for run_id in held:
                    self._release_hold(run_id)

    def _cancel_probe(self, run_id: int) -> Callable[[], bool]:
        last_check = [0.0]

        def probe() -> bool:
            with self._lock:
                if run_id in self._cancelled:
                    return True
            # Ask the database at most once a second; the heartbeat also refreshes it.
            if time.monotonic() - last_check[0] >= 1.0:
                last_check[0] = time.monotonic()
                try:
                    flag = run_service.cancel_requested(run_id)
                except Exception:  # noqa: BLE001 - task code calls this: it must not raise; the heartbeat re-reads it
                    flag = False
                if flag:
                    with self._lock:
                        self._cancelled.add(run_id)
                    return True
            return False

        return probe

    def _record(
        self, fn: Callable[..., Any], *, runs: dict[int, int], outcome: str, note_failure: bool = True,
        **kwargs: Any,
    ) -> Any:
        """Call an outcome service for ``runs`` (id -> attempt); never lets it stop the worker.

        Transient database errors are retried with backoff for about two lease
        periods; by then the run has been (or will be) recovered by lease
        expiry, which is the at-least-once path. Any other exception (a
        database refusal, a bug, text no encoder takes) is logged with the run
        ids, noted in the runs' history where the database still answers, and
        raised as ``_NotRecorded``: the run keeps its lease, which expires.
        """
        delay = 0.2
        deadline = time.monotonic() + max(2 * self.lease_seconds, 10.0)
        run_ids = ",".join(map(str, sorted(runs)))
        while True:
            try:
                return fn(now=self.clock.now(), **kwargs)
            except TRANSIENT_DB_ERRORS as exc:
                self._reset_connection()
                if self._hard_stop or time.monotonic() > deadline:
                    self._log(logging.ERROR, "giving up recording outcome; lease expiry will recover the run",
                              run_id=run_ids, outcome=outcome, error=describe_exception(exc))
                    raise _NotRecorded(exc, transient=True) from None
                self._log(logging.WARNING, "database error while recording; retrying",
                          run_id=run_ids, outcome=outcome, error=describe_exception(exc), retry_in=f"{delay:.1f}")
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
            except Exception as exc:  # noqa: BLE001 - an outcome we cannot record must not stop the worker
                self._log(logging.ERROR, "could not record outcome; the lease will expire and the run be retried",
                          run_id=run_ids, outcome=outcome, error=describe_exception(exc))
                if note_failure:
                    self._note_unrecorded(runs, outcome, exc)
                raise _NotRecorded(exc, transient=False) from None

    def _note_unrecorded(self, held: dict[int, int], outcome: str, exc: BaseException) -> None:
        """Best effort: tell the runs' history why they will be re-executed."""
        try:
            outcomes.note_unrecorded(worker_id=self.worker_id, held=held, outcome=outcome,
                                     error=describe_exception(exc), now=self.clock.now())
        except Exception as note_exc:  # noqa: BLE001 - the log line above already says it
            self._log(logging.WARNING, "could not note the unrecorded outcome in the run history",
                      run_id=",".join(map(str, sorted(held))), error=describe_exception(note_exc))

    # -- the loop ----------------------------------------------------------------

    def run(self, *, max_runs: int | None = None, burst: bool = False, install_signals: bool = True) -> int:
        """Serve until stopped (signal or ``request_stop``), ``max_runs`` executions,
        or, with ``burst``, until nothing is due. Returns the number executed."""
        restore = self._install_signals() if install_signals else None
        executed_before = self.executed
        try:
            self._retry_db(self.register)
            with self._heartbeat_running():
                if self.concurrency > 1:
                    self._serve_threaded(max_runs=max_runs, burst=burst, start=executed_before)
                else:
                    self._serve(max_runs=max_runs, burst=burst, start=executed_before)
        finally:
            self.flush()
            self._retry_db(lambda: workers.set_status(
                worker_id=self.worker_id, status=WorkerStatus.STOPPED, now=self.clock.now(),
                runs_executed=self.executed), attempts=3)
            self._log(logging.INFO, "worker stopped", executed=self.executed - executed_before)
            if restore:
                restore()
        return self.executed - executed_before

    def _remaining(self, max_runs: int | None, start: int) -> int | None:
        return None if max_runs is None else max_runs - (self.executed - start)

    def _claim_or_backoff(self, limit: int, backoff: list[float], start_all: bool = False) -> list[Run] | None:
        """Claim a batch; on an error (the database, a stored row) wait and return None."""
        try:
            self._maybe_tick()
            runs = self._claim(limit, start_all=start_all)
            backoff[0] = 0.5
            return runs
        except Exception as exc:  # noqa: BLE001 - logged and retried with backoff; never stops the worker
            self._log(logging.WARNING if isinstance(exc, TRANSIENT_DB_ERRORS) else logging.ERROR,
                      "error in worker loop; backing off", error=describe_exception(exc),
                      retry_in=f"{backoff[0]:.1f}")
            self._reset_connection()
            self._stop.wait(backoff[0])
            backoff[0] = min(backoff[0] * 2, MAX_DB_BACKOFF_SECONDS)
            return None

    def _serve(self, *, max_runs: int | None, burst: bool, start: int) -> None:
        backoff = [0.5]
        while not self._stop.is_set():
            remaining = self._remaining(max_runs, start)
            if remaining is not None and remaining <= 0:
                break
            runs = self._claim_or_backoff(self._batch_size(remaining), backoff)
            if runs is None:
                continue
            if not runs:
                self.flush()
                if burst:
                    break
                self._idle_wait()
                continue
            batch = self._hold(runs)
            for index, attempt in enumerate(batch):
                if index > 0 and self._stop.is_set():
                    self._release_unstarted(batch[index:])
                    break
                self._run_task(attempt)
                self._finish(attempt, flush=False)
                if self._flush_due():
                    self.flush()
            self.flush()

    def _serve_threaded(self, *, max_runs: int | None, burst: bool, start: int) -> None:
        """``concurrency`` tasks at once in threads (for I/O-bound tasks)."""
        backoff = [0.5]
        running: dict[Future, _Attempt] = {}
        claimed_total = 0
        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="distsched-task") as pool:
            while True:
                free = self.concurrency - len(running)
                room = None if max_runs is None else max_runs - claimed_total
                if not self._stop.is_set() and free > 0 and (room is None or room > 0):
                    runs = self._claim_or_backoff(free if room is None else min(free, room), backoff, start_all=True)
                    for attempt in self._hold(runs or []):
                        running[pool.submit(self._run_in_thread, attempt)] = attempt
                    claimed_total += len(runs or [])
                    if not running and runs == [] and burst:
                        break
                if not running:
                    if self._stop.is_set() or (room is not None and room <= 0):
                        break
                    self._stop.wait(self.poll_interval)
                    continue
                done, _ = wait(list(running), timeout=self.poll_interval, return_when=FIRST_COMPLETED)
                for future in done:
                    self._finish(running.pop(future), flush=False)
                if self._flush_due() or not running:
                    self.flush()

    def _idle_wait(self) -> None:
        """Sleep until the next run or schedule slot is due, at most one poll interval.

        A slot that has come but whose run does not exist yet is being ticked by
        another process any moment: poll briefly for it, unless it has been
        overdue for long (then no ticker runs and short polls would only burn CPU).
        """
        delay = self.poll_interval
        now = self.clock.now()
        try:
            due = claiming.next_due(queues=self.queues)
        except TRANSIENT_DB_ERRORS:
            self._reset_connection()
            due = claiming.NextDue(run=None, schedule=None)
        if due.run is not None:
            delay = min(delay, max(0.0, (due.run - now).total_seconds()) + 0.001)
        if due.schedule is not None:
            ahead = (due.schedule - now).total_seconds()
            if ahead > 0:
                delay = min(delay, ahead + 0.001)
            elif ahead > -TICKER_GRACE_SECONDS:
                delay = min(delay, 0.0 if self.with_tick else TICKER_POLL_SECONDS)
            if self.with_tick and ahead < delay + 0.001:
                self._next_tick = 0.0  # tick as soon as we wake: the due slot is why we woke
        if delay > 0:
            self._stop.wait(delay)

    def _run_in_thread(self, attempt: _Attempt) -> None:
        try:
            self._run_task(attempt)
        finally:
            close_old_connections()

    def _retry_db(self, fn: Callable[[], Any], attempts: int | None = None) -> None:
        delay = 0.5
        tries = 0
        while True:
            try:
                fn()
                return
            except TRANSIENT_DB_ERRORS as exc:
                tries += 1
                self._reset_connection()
                if (attempts is not None and tries >= attempts) or self._hard_stop:
                    self._log(logging.ERROR, "database unavailable", error=describe_exception(exc))
                    return
                self._log(logging.WARNING, "database unavailable; retrying", error=describe_exception(exc),
                          retry_in=f"{delay:.1f}")
                time.sleep(delay)
                delay = min(delay * 2, MAX_DB_BACKOFF_SECONDS)
            except Exception as exc:
                if attempts is None:
                    raise  # registering at start: a worker that cannot register must not serve
                # Best effort at shutdown (the stopped status): log, and let the process exit cleanly.
                self._log(logging.ERROR, "could not update the worker row", error=describe_exception(exc))
                return

    @staticmethod
    def _reset_connection() -> None:
        try:
            if connection.in_atomic_block:
                return
            connection.close()
        except DatabaseError:
            pass

    # -- heartbeat thread --------------------------------------------------------

    @contextmanager
    def _heartbeat_running(self) -> Iterator[None]:
        if self._heartbeat_thread is not None:
            yield
            return
        self._heartbeat_stop.clear()
        thread = threading.Thread(target=self._heartbeat_loop, name=f"distsched-heartbeat-{self.worker_id}",
                                  daemon=True)
        self._heartbeat_thread = thread
        thread.start()
        try:
            yield
        finally:
            self._heartbeat_stop.set()
            thread.join(timeout=self.heartbeat_seconds + 5)
            self._heartbeat_thread = None

    def _heartbeat_loop(self) -> None:
        try:
            while not self._heartbeat_stop.wait(self.heartbeat_seconds):
                try:
                    self.heartbeat()
                except Exception as exc:  # noqa: BLE001 - the heartbeat must outlive DB hiccups
                    self._log(logging.WARNING, "heartbeat failed", error=describe_exception(exc))
                    self._reset_connection()
        finally:
            close_old_connections()
            connection.close()

    # -- signals -----------------------------------------------------------------

    def _install_signals(self) -> Callable[[], None] | None:
        if threading.current_thread() is not threading.main_thread():
            return None
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

        def handler(signum: int, frame: Any) -> None:
            if self._stop.is_set():
                # Second signal: leave now. Lease expiry recovers the runs we hold.
                self._hard_stop = True
                sys.stderr.write(f"distsched: second {signal.Signals(signum).name}, exiting now\n")
                sys.stderr.flush()
                os._exit(1)
            self._stop.set()
            self._log(logging.INFO, "stop requested; finishing current run", signal=signal.Signals(signum).name)

        for sig in previous:
            signal.signal(sig, handler)

        def restore() -> None:
            for sig, old in previous.items():
                signal.signal(sig, old)

        return restore

    # -- logging -----------------------------------------------------------------

    def _log_finished(self, attempt: _Attempt, state: str | None, label: str = "lease_lost") -> None:
        """``label`` names a run not recorded as ``state``: lease_lost or unrecorded."""
        run = attempt.run
        level = logging.INFO if state in (RunState.SUCCEEDED, RunState.CANCELLED) else logging.WARNING
        self._log(level, "run finished", run_id=run.pk, schedule=run.schedule.name, task=run.task_name,
                  attempt=run.attempts, state=state or label, duration=f"{attempt.duration:.3f}",
                  error=attempt.error[:200] if attempt.error else None)

    def _log(self, level: int, message: str, **fields: Any) -> None:
        if logger.isEnabledFor(level):
            data = {"worker_id": self.worker_id}
            # Task errors reach log lines too: escaped, so no handler's encoder can fail on them.
            data.update({k: storable(v) if isinstance(v, str) else v for k, v in fields.items() if v is not None})
            logger.log(level, message, extra={"distsched": data})
