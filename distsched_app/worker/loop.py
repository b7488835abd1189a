"""The worker loop: claim, execute outside any transaction, record, repeat.

One loop body whatever the concurrency. With one slot, the task runs in the
loop's own thread and, while tasks are quick, runs are claimed in batches of
up to ``prefetch`` (one transaction, each run with its own lease and attempt)
and their successes written in one transaction per batch. With N slots, tasks
run in a pool of N threads and each claim fills the free slots. Throughput
comes from amortising transactions, not from weakening them.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from django.db import connections

from ..context import RunContext
from ..db.retry import Backoff, is_transient, reset_connection, retry_transient
from ..models import Run, WorkerStatus
from ..services import bulk as bulk_service
from ..services import chore_look, claiming, workers, workflow_release
from ..services import limits as limit_service
from ..services import runs as run_service
from ..services import tick as tick_service
from ..services.leader_chores import Leadership
from . import frameworks, signals
from .execute import Attempt, Execution, async_in_caller, call_task, describe_exception
from .pacing import IdleBackoff
from .slots import task_slots
from .upstream import upstream_loader

if TYPE_CHECKING:
    from . import Worker

# Prefetch only while tasks are quick: a slow task would hold prefetched runs
# that idle workers could be running.
FAST_TASK_SECONDS = 0.05
# And a batch holds at most about this much work at the recent pace: 128 runs (``PREFETCH``) of
# 40 ms tasks would keep 5 s of a burst from the other workers. 1.6 s is what the old default
# batch of 32 could hold (32 x 50 ms); tasks under 12.5 ms get the whole batch.
BATCH_SECONDS = 1.6
# How often the lease-recovery query runs (it need not run on every claim).
EXPIRED_CHECK_SECONDS = 1.0
# An idle worker expects another process to tick a due slot within this long,
# and polls for its run every TICKER_POLL_SECONDS meanwhile.
TICKER_GRACE_SECONDS = 2.0
TICKER_POLL_SECONDS = 0.02
# A running task asks the database whether it was cancelled at most this often.
CANCEL_PROBE_SECONDS = 1.0
# Bulk actions: at most this long per loop turn while one is unfinished; else a look this often.
BULK_BUDGET_SECONDS = 0.5
BULK_IDLE_SECONDS = 5.0
# ``maybe_sweep`` and ``maybe_bulk`` run back to back: a look this recent serves both.
LOOK_REUSE_SECONDS = 1.0


class Pace:
    """How long tasks take lately (a moving average), which decides whether to prefetch."""

    def __init__(self) -> None:
        self.average: float | None = None

    def observe(self, seconds: float) -> None:
        self.average = seconds if self.average is None else 0.8 * self.average + 0.2 * seconds

    def batch_size(self, prefetch: int, remaining: int | None = None) -> int:
        """Runs to claim at once: ``prefetch`` while tasks are quick, no more than ``BATCH_SECONDS``
        of work at their average, else one; at most ``remaining``."""
        average = self.average
        if average is None or average >= FAST_TASK_SECONDS:
            size = 1
        elif average * prefetch > BATCH_SECONDS:
            size = max(1, int(BATCH_SECONDS / average))
        else:
            size = prefetch
        return max(1, min(size, remaining)) if remaining is not None else size


class Loop:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.pace = Pace()
        self._pace_lock = threading.Lock()
        self._next_tick = 0.0
        self._probe_pool: ThreadPoolExecutor | None = None
        # Monotonic time of the next lease-recovery query (it runs about once a second).
        self.next_expired_check = 0.0
        # Monotonic time of the next flow-control sweep (``services.limits.sweep``).
        self._next_sweep = 0.0
        # Monotonic time of the next look for bulk actions to work on (``maybe_bulk``).
        self._next_bulk = 0.0
        self._next_workflow_sweep = 0.0
        # The last chore look (``chore_look.look``: a live leader? a bulk action waiting?) and when.
        self._look: chore_look.ChoreLook | None = None
        self._look_at = float("-inf")
        # A bulk action was left unfinished by the last turn's budget: go on without looking.
        self._bulk_more = False
        # Woken by a notification: the next claim goes straight for the waiting runs (one
        # statement on PostgreSQL); lease recovery follows when due (``claim``).
        self.woken = False
        # ``--with-tick`` serving until stopped: campaigns, and ticks only while it leads. A burst
        # or ``run_once`` ticks unelected, like a one-off ``manage.py tick``.
        self.leadership: Leadership | None = None
        # Async tasks awaited with async_to_sync on the calling thread (``testing.drain``).
        self._in_caller = False
        # The idle poll interval: POLL_INTERVAL, longer while notifications wake this worker (``pacing``).
        self.idle = IdleBackoff(poll=worker.poll_interval, ceiling=worker.idle_poll_max, jitter=worker.heartbeat_jitter)

    # -- entry points -------------------------------------------------------------

    def run(self, *, max_runs: int | None, burst: bool, install_signals: bool) -> int:
        w = self.worker
        restore = signals.install(w) if install_signals else None
        before = w.executed
        if w.with_tick and not burst:
            self.leadership = Leadership(holder=w.worker_id, figures_clock=w.clock.now)
        try:
            self._retry_db(w.register, attempts=None)
            if not burst:
                w.wakeup.start()  # PostgreSQL: woken at commit instead of at the next poll
            with w.heartbeat_thread.running():
                self.serve(max_runs=max_runs, burst=burst)
        finally:
            w.wakeup.stop()
            w.recorder.flush()
            if self.leadership is not None:
                self.leadership.stop()
            self._retry_db(
                lambda: workers.set_status(
                    worker_id=w.worker_id, status=WorkerStatus.STOPPED, now=w.clock.now(), runs_executed=w.executed
                ),
                attempts=3,
            )
            self.close()
            w.log(logging.INFO, "worker stopped", executed=w.executed - before)
            if restore:
                restore()
        return w.executed - before

    def run_once(self) -> Execution | None:
        w = self.worker
        if not w.registered:
            w.register()
        with w.heartbeat_thread.running():
            self.maybe_tick(force=True)
            runs = self.claim(1, force_expired=True)
            if not runs:
                return None
            try:
                return self.execute(w.held.hold(runs)[0], flush=True)
            finally:
                self.close()

    def execute(self, attempt: Attempt, *, flush: bool) -> Execution:
        """Call the attempt's task, then record (a success is buffered unless ``flush``)."""
        self.call(attempt)
        return self.worker.recorder.finish(attempt, flush=flush)

    # -- the loop body ------------------------------------------------------------

    def serve(self, *, max_runs: int | None, burst: bool) -> None:
        """Until stopped, ``max_runs`` runs claimed, or (``burst``) nothing is due."""
        w = self.worker
        backoff = Backoff()
        claimed = 0
        with task_slots(self) as slots:
            while True:
                room = None if max_runs is None else max_runs - claimed
                free = slots.free()
                if not w.stopping and free and (room is None or room > 0):
                    if slots.inline:
                        limit = self.pace.batch_size(w.prefetch, room)
                    else:
                        limit = free if room is None else min(free, room)
                    runs = self._claim_or_back_off(limit, backoff, start_all=not slots.inline)
                    if runs is None:
                        continue
                    if runs:
                        self.idle.found_work()
                        claimed += len(runs)
                        slots.start(w.held.hold(runs))
                    elif not slots.busy():
                        w.recorder.flush()
                        if burst:
                            break
                        self.idle_wait()
                        continue
                elif not slots.busy():
                    break  # stopping, or max_runs claimed, and nothing left in flight
                slots.collect(timeout=w.poll_interval)
                if w.recorder.flush_due() or not slots.busy():
                    w.recorder.flush()

    def call(self, attempt: Attempt) -> None:
        """Call the task (never raises) and keep the pace."""
        w = self.worker
        self._in_caller = async_in_caller()
        run = attempt.run
        if w.guard.resolve(run.task_name) is None and not w.held.cancel_requested(run.pk):
            w.guard.note_unknown(run.task_name, run.pk)  # given back by the recorder, attempt unused
            attempt.unknown, attempt.started_at = True, w.clock.now()
            attempt.finished_at = attempt.started_at
            return
        cancelled_before = w.held.start(attempt.run_id)
        context = RunContext(
            run_id=run.pk,
            schedule_id=run.schedule_id,
            schedule_name=run.schedule.name if run.schedule is not None else (run.deleted_schedule or ""),
            worker_id=w.worker_id,
            scheduled_for=run.scheduled_for,
            attempt=run.attempts,
            idempotency_key=run.idempotency_key,
            _cancel_probe=self._cancel_probe(run.pk, attempt),
            **upstream_loader(run),
        )
        call_task(
            attempt,
            registry=w.registry,
            context=context,
            framework_context=lambda entry: frameworks.context(entry, attempt, context),
            on_start=lambda entry: frameworks.started(w, entry, attempt),
            clock=w.clock,
            cancelled_before_start=cancelled_before,
        )
        with self._pace_lock:
            self.pace.observe(attempt.duration)
        w.held.stop(attempt.run_id)

    # -- claiming -----------------------------------------------------------------

    def claim(self, limit: int, *, force_expired: bool = False, start_all: bool = False) -> list[Run]:
        """Claim up to ``limit`` runs; expired leases are looked for about once a second
        whatever wakes the worker.

        A claim woken by a notification goes straight for the waiting runs (one statement on
        PostgreSQL). If that finds nothing and lease recovery is due, the full claim follows at
        once: a trickle of notifications (from anyone who can connect) must not keep an idle
        worker from ever recovering a dead worker's runs. A woken claim that found nothing also
        tells the listener, which then spaces further wake-ups out (``Wakeup.settle``).
        """
        w = self.worker
        woken, self.woken = self.woken and not force_expired, False
        due = force_expired or time.monotonic() >= self.next_expired_check
        runs = self._claim(limit, include_expired=due and not woken, start_all=start_all)
        if woken:
            w.wakeup.settle(found_work=bool(runs))
            if not runs and due:
                woken = False
                runs = self._claim(limit, include_expired=True, start_all=start_all)
        if due and not woken:
            self.next_expired_check = time.monotonic() + EXPIRED_CHECK_SECONDS
        elif not woken and len(runs) < limit:
            self.next_expired_check = 0.0  # idle soon: look for abandoned runs on the next claim
        return runs

    def _claim(self, limit: int, *, include_expired: bool, start_all: bool) -> list[Run]:
        w = self.worker
        return claiming.claim_runs(
            worker_id=w.worker_id,
            queues=w.queues,
            lease_seconds=w.lease_seconds,
            now=w.clock.now(),
            limit=limit,
            include_expired=include_expired,
            start_all=start_all,
            capabilities=w.capabilities,
            skip_tasks=w.guard.skipped(),
        )

    def _claim_or_back_off(self, limit: int, backoff: Backoff, *, start_all: bool) -> list[Run] | None:
        """Claim a batch; on an error (the database, a stored row) wait and return None."""
        w = self.worker
        try:
            self.maybe_tick()
            self.maybe_sweep()
            self.maybe_bulk()
            w.guard.maybe_warn_unserved()
            runs = self.claim(limit, start_all=start_all)
        except Exception as exc:  # noqa: BLE001 - logged and retried with backoff; never stops the worker
            delay = backoff.next_delay()
            w.log(
                logging.WARNING if is_transient(exc) else logging.ERROR,
                "error in worker loop; backing off",
                error=describe_exception(exc),
                retry_in=f"{delay:.1f}",
            )
            reset_connection()
            w.wait(delay)
            return None
        backoff.reset()
        return runs

    def chores(self) -> chore_look.ChoreLook | None:
        """The look for chores both ``maybe_sweep`` and ``maybe_bulk`` use: one statement (a live
        leader? a bulk action waiting?), taken again when the last is older than ``LOOK_REUSE_SECONDS``.
        None if it failed (logged): then each chore does what it did before looks existed."""
        if self._look is not None and time.monotonic() - self._look_at < LOOK_REUSE_SECONDS:
            return self._look
        w = self.worker
        try:
            self._look = chore_look.look(w.clock.now())
        except Exception as exc:  # noqa: BLE001 - a look never stops claims (a table not migrated yet, say)
            w.log(logging.WARNING, "error looking for chores; trying again later", error=describe_exception(exc))
            if is_transient(exc):
                reset_connection()
            self._look = None
            return None
        self._look_at = time.monotonic()
        return self._look

    def maybe_sweep(self) -> None:
        """Every few seconds: let through runs a missed release left blocked (the safety net of
        flow control and overlap=replace), and end expired limit overrides. A chore of the
        leader (``leader_chores``): a worker does it itself only while no process leads (the
        shared look, ``chores``, says so; a failed look sweeps, as if nobody led)."""
        if time.monotonic() < self._next_sweep:
            return
        # An idle worker backing off its polls (``pacing.IdleBackoff``) looks as rarely: at a thousand
        # workers these looks cost more than the heartbeats.
        self._next_sweep = time.monotonic() + max(limit_service.SWEEP_SECONDS, self.idle.current)
        if self.leadership is not None:
            return
        look = self.chores()
        if look is not None and look.leader_live:
            return
        limit_service.sweep(self.worker.clock.now())
        if time.monotonic() >= self._next_workflow_sweep:  # workflow nodes a missed transition left waiting
            self._next_workflow_sweep = time.monotonic() + workflow_release.SWEEP_SECONDS
            workflow_release.sweep(self.worker.clock.now())

    def maybe_bulk(self) -> None:
        """Work on operators' bulk actions (``services.bulk``) for at most ``BULK_BUDGET_SECONDS``
        per loop: again at the next turn while one is unfinished, else look every ``BULK_IDLE_SECONDS``
        (the shared look, ``chores``: nothing more is asked when no action waits).
        An error is logged and tried again later, never passed on: claims go on whatever happens here."""
        if time.monotonic() < self._next_bulk:
            return
        w = self.worker
        self._next_bulk = time.monotonic() + max(BULK_IDLE_SECONDS, self.idle.current)
        if not self._bulk_more:
            look = self.chores()
            if look is not None and not look.bulk_waiting:
                return
        self._bulk_more = False
        try:
            done = bulk_service.process_bulk_actions(w.clock, owner=w.worker_id, budget_seconds=BULK_BUDGET_SECONDS)
        except Exception as exc:  # noqa: BLE001 - bulk work never stops claims (a table not migrated yet, say)
            w.log(logging.WARNING, "error in bulk actions; trying again later", error=describe_exception(exc))
            if is_transient(exc):
                reset_connection()
            return
        if done.more:
            self._next_bulk = 0.0
            self._bulk_more = True

    def maybe_tick(self, force: bool = False) -> None:
        w = self.worker
        if not w.with_tick or (not force and time.monotonic() < self._next_tick):
            return
        if self.leadership is None or force:
            self._next_tick = time.monotonic() + w.poll_interval
            tick_service.tick(now=w.clock.now())
            return
        self.leadership.turn(w.clock.now())
        # The next turn: the poll interval, sooner if the election is due (a renewal, a try).
        self._next_tick = time.monotonic() + min(w.poll_interval, self.leadership.elector.wait_seconds())

    def idle_wait(self) -> None:
        """Sleep until the next run or schedule slot is due, at most one idle poll interval
        (``POLL_INTERVAL``, growing up to ``IDLE_POLL_MAX_SECONDS`` while a listener wakes this
        worker at every commit that makes a run claimable: ``pacing.IdleBackoff``).

        A slot that has come but whose run does not exist yet is being ticked by
        another process any moment: poll briefly for it, unless it has been
        overdue for long (then no ticker runs and short polls would only burn CPU).
        """
        w = self.worker
        # A ticking worker keeps the poll interval: its ticks and elections run from this loop.
        delay = self.idle.next_delay(listening=w.wakeup.connected.is_set() and not w.with_tick)
        if self.leadership is not None:  # wake for the election's next renewal or try
            delay = min(delay, max(0.001, self.leadership.elector.wait_seconds()))
        now = w.clock.now()
        try:
            due = claiming.next_due(queues=w.queues, capabilities=w.capabilities, skip_tasks=w.guard.skipped())
        except Exception:  # noqa: BLE001 - then wait a full poll interval; the next claim reports the error
            reset_connection()
            due = claiming.NextDue(run=None, schedule=None)
        if due.run is not None:
            delay = min(delay, max(0.0, (due.run - now).total_seconds()) + 0.001)
        if due.schedule is not None:
            ahead = (due.schedule - now).total_seconds()
            if ahead > 0:
                delay = min(delay, ahead + 0.001)
            elif ahead > -TICKER_GRACE_SECONDS:
                delay = min(delay, 0.0 if w.with_tick else TICKER_POLL_SECONDS)
            if w.with_tick and ahead < delay + 0.001:
                self._next_tick = 0.0  # tick as soon as we wake: the due slot is why we woke
        if delay > 0:
            self.woken = w.wait(delay) and not w.stopping

    # -- helpers ------------------------------------------------------------------

    def _cancel_probe(self, run_id: int, attempt: Attempt) -> Callable[[], bool]:
        held = self.worker.held
        last_check = [0.0]

        def probe() -> bool:
            if attempt.timed_out or held.cancel_requested(run_id):  # past its timeout: asked to stop too
                return True
            # Ask the database at most once a second; the heartbeat also refreshes it.
            if time.monotonic() - last_check[0] >= CANCEL_PROBE_SECONDS:
                last_check[0] = time.monotonic()
                try:
                    flag = self._ask_cancel_requested(run_id)
                except Exception:  # noqa: BLE001 - task code calls this: it must not raise; the heartbeat re-reads it
                    flag = False
                if flag:
                    held.note_cancel_requested({run_id})
                    return True
            return False

        return probe

    def _ask_cancel_requested(self, run_id: int) -> bool:
        """The database's cancel flag. Inside an async task's event loop Django refuses queries,
        so there the question goes to one helper thread (its connection kept for the next one)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return run_service.cancel_requested(run_id)
        if self._in_caller:  # testing.drain: one thread, one connection; the flag read at claim stands
            return False
        with self._pace_lock:
            if self._probe_pool is None:
                self._probe_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="distsched-probe")
        return self._probe_pool.submit(run_service.cancel_requested, run_id).result(timeout=30)

    def close(self) -> None:
        """Stop the cancel-probe helper thread, if an async task started one (with its connection)."""
        pool, self._probe_pool = self._probe_pool, None
        if pool is not None:
            pool.submit(connections.close_all).result(timeout=30)
            pool.shutdown(wait=True)

    def _retry_db(self, fn: Callable[[], object], *, attempts: int | None) -> None:
        """Registration (retried until it works) and the final status (best effort, ``attempts`` tries)."""
        w = self.worker

        def on_retry(exc: BaseException, delay: float) -> None:
            w.log(
                logging.WARNING,
                "database unavailable; retrying",
                error=describe_exception(exc),
                retry_in=f"{delay:.1f}",
            )

        try:
            retry_transient(
                fn,
                backoff=Backoff(),
                on_retry=on_retry,
                give_up=lambda tries, _: w.hard_stopped or (attempts is not None and tries >= attempts),
            )
        except Exception as exc:
            if attempts is None and not is_transient(exc):
                raise  # registering at start: a worker that cannot register must not serve
            # The final status is best effort: log, and let the process exit cleanly.
            w.log(
                logging.ERROR,
                "database unavailable" if is_transient(exc) else "could not update the worker row",
                error=describe_exception(exc),
            )
