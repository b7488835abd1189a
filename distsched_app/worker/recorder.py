"""Recording outcomes: a failure at once, successes buffered and written one transaction per batch.

Every write goes through the fenced outcome services, and nothing that goes
wrong while writing stops the worker. Transient database errors are retried
with backoff for about two lease periods (``db.retry``); anything else (a
refused row, a bug, text no encoder takes) is logged with the run ids, noted in
the runs' history where the database still answers (``record_failed``), and the
run keeps its lease, which expires: another worker then runs it again, the
at-least-once path. A batch of successes that cannot be written is written
again one run per transaction, so one bad success costs only itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..db.retry import Backoff, is_transient, retry_transient
from ..models import RunState
from ..services import outcomes, unknown_tasks
from . import frameworks
from .execute import Attempt, Execution, describe_exception

if TYPE_CHECKING:
    from . import Worker

# Buffered successes are written once this many wait, or the oldest has waited this long.
FLUSH_AFTER_SECONDS = 0.5


class NotRecorded(Exception):
    """An outcome service failed for good; ``transient`` if the database stayed unreachable."""

    def __init__(self, error: BaseException, *, transient: bool) -> None:
        super().__init__(describe_exception(error))
        self.transient = transient


class Recorder:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        # Serialises the heartbeat's lease renewal with outcome recording, so a
        # run recorded a moment ago is never mistaken for a lost lease.
        self.lock = threading.RLock()
        self._buffer_lock = threading.Lock()
        self._pending: list[Attempt] = []
        self._first_pending_at = 0.0

    def finish(self, attempt: Attempt, *, flush: bool) -> Execution:
        """Record a failure at once; buffer a success (written by ``flush``)."""
        w = self.worker
        if attempt.unknown:
            return self._release_unknown(attempt)
        if attempt.failed:
            state, recorded = self._settle_one(
                attempt,
                outcomes.record_failure,
                outcome="failed",
                error=attempt.error,
                traceback_text=attempt.tb,
                cancelled=attempt.cancelled,
                final=attempt.final,
                exception_class_path=attempt.error_class,
                exception_type=attempt.error_type,
                started_at=attempt.started_at,
                record_started=not attempt.started_recorded,
            )
            label = (state or "lease_lost") if recorded else "unrecorded"
            self._log_finished(attempt, state, label)
            frameworks.finished(w, attempt, state)
            return Execution(
                run_id=attempt.run_id,
                attempt=attempt.number,
                state=state,
                duration=attempt.duration,
                error=attempt.error,
            )
        with self._buffer_lock:
            if not self._pending:
                self._first_pending_at = time.monotonic()
            self._pending.append(attempt)
        state = RunState.SUCCEEDED.value
        # A run under a nearly full limit holds a slot others may wait for until its success is
        # written: write it now, not with the next batch (``limits.Gate.tight``).
        if flush or getattr(attempt.run, "limit_tight", False):
            lost = self.flush()
            state = None if lost is None or attempt.run_id in lost else state
        return Execution(run_id=attempt.run_id, attempt=attempt.number, state=state, duration=attempt.duration)

    def _settle_one(self, attempt: Attempt, fn: Callable[..., Any], *, outcome: str, **kwargs: Any) -> tuple[Any, bool]:
        """Call outcome service ``fn`` for one attempt under the lock (fenced on this worker and the
        attempt), then stop holding the run: ``(fn's answer, True)``, or ``(None, False)`` when it
        could not be recorded."""
        w = self.worker
        with self.lock:
            try:
                answer = self.call(
                    fn,
                    runs={attempt.run_id: attempt.number},
                    outcome=outcome,
                    run_id=attempt.run_id,
                    worker_id=w.worker_id,
                    attempt=attempt.number,
                    **kwargs,
                )
                recorded = True
            except NotRecorded:
                answer, recorded = None, False
            w.held.release(attempt.run_id)
        return answer, recorded

    def _release_unknown(self, attempt: Attempt) -> Execution:
        """Give back a run whose task is not registered here, its attempt unused (``worker.guard``)."""
        w = self.worker
        run = attempt.run
        # Not recorded: still leased to us, lease expiry hands it to another worker.
        answer, _ = self._settle_one(
            attempt, unknown_tasks.release_unknown, outcome="released", task_name=run.task_name
        )
        released = bool(answer)
        w.log(
            logging.INFO,
            "run released: task not registered here",
            run_id=run.pk,
            task=run.task_name,
            attempt=attempt.number,
            state=RunState.PENDING.value if released else "lease_lost",
        )
        state = RunState.PENDING.value if released else None
        return Execution(run_id=attempt.run_id, attempt=attempt.number, state=state, duration=0.0)

    def flush_due(self) -> bool:
        with self._buffer_lock:
            n = len(self._pending)
        return n >= self.worker.prefetch or (n > 0 and time.monotonic() - self._first_pending_at >= FLUSH_AFTER_SECONDS)

    def flush(self) -> set[int] | None:
        """Write buffered successes in one transaction. Returns the ids not recorded as
        succeeded (lease lost, or not recordable: lease expiry recovers those), or None
        if the database could not be reached at all."""
        w = self.worker
        with self._buffer_lock:
            pending, self._pending = self._pending, []
        if not pending:
            return set()
        cancelled = w.held.cancelled()
        successes = [
            outcomes.Success(
                run_id=a.run_id,
                attempt=a.number,
                started_at=a.started,
                finished_at=a.finished,
                result=a.result,
                record_started=not a.started_recorded,
                note="returned normally after a cancel request" if a.run_id in cancelled else "",
            )
            for a in pending
        ]
        lost: set[int] | None = None
        unrecorded = {s.run_id for s in successes}
        with self.lock:
            try:
                lost, unrecorded = self._record_successes(successes)
            except NotRecorded:
                pass  # none recorded: lease expiry recovers them all
            for a in pending:
                w.held.release(a.run_id)
        for a in pending:
            if a.run_id in unrecorded:
                self._log_finished(a, None, "unrecorded")
            elif lost is not None and a.run_id in lost:
                self._log_finished(a, None, "lease_lost")
            else:
                self._log_finished(a, RunState.SUCCEEDED.value)
                frameworks.finished(w, a, RunState.SUCCEEDED.value)
        return None if lost is None else lost | unrecorded

    def _record_successes(self, successes: list[outcomes.Success]) -> tuple[set[int], set[int]]:
        """The batch in one transaction; if it cannot be written for a reason other than an
        unreachable database, one transaction per run.

        Returns the ids whose lease was lost, and those that could not be recorded (each
        with a ``record_failed`` note where possible).
        """
        held = {s.run_id: s.attempt for s in successes}
        w = self.worker
        try:
            lost: set[int] = self.call(
                outcomes.record_successes,
                runs=held,
                outcome="succeeded",
                worker_id=w.worker_id,
                successes=successes,
                note_failure=len(successes) == 1,
            )
            return lost, set()
        except NotRecorded as exc:
            if exc.transient or len(successes) == 1:
                raise
        lost, unrecorded = set(), set()
        for success in successes:
            try:
                lost |= self.call(
                    outcomes.record_successes,
                    runs={success.run_id: success.attempt},
                    outcome="succeeded",
                    worker_id=w.worker_id,
                    successes=[success],
                )
            except NotRecorded:
                unrecorded.add(success.run_id)
        return lost, unrecorded

    def release_unstarted(self, attempts: list[Attempt]) -> None:
        """Give back prefetched runs never started (stopping): their leases and unused attempts."""
        held = {a.run_id: a.number for a in attempts}
        if not held:
            return
        with self.lock:
            try:
                self.call(
                    outcomes.release_runs,
                    runs=held,
                    outcome="released",
                    note_failure=False,
                    worker_id=self.worker.worker_id,
                    held=held,
                )
            except NotRecorded:
                pass  # still leased to us: lease expiry hands them to another worker
            for run_id in held:
                self.worker.held.release(run_id)

    def call(
        self, fn: Callable[..., Any], *, runs: dict[int, int], outcome: str, note_failure: bool = True, **kwargs: Any
    ) -> Any:
        """Call an outcome service for ``runs`` (id -> attempt); raise ``NotRecorded`` if it cannot be done."""
        w = self.worker
        run_ids = ",".join(map(str, sorted(runs)))
        deadline = max(2 * w.lease_seconds, 10.0)

        def on_retry(exc: BaseException, delay: float) -> None:
            w.log(
                logging.WARNING,
                "database error while recording; retrying",
                run_id=run_ids,
                outcome=outcome,
                error=describe_exception(exc),
                retry_in=f"{delay:.1f}",
            )

        try:
            return retry_transient(
                lambda: fn(now=w.clock.now(), **kwargs),
                backoff=Backoff(initial=0.2, maximum=5.0),
                give_up=lambda tries, elapsed: w.hard_stopped or elapsed > deadline,
                on_retry=on_retry,
            )
        except Exception as exc:  # noqa: BLE001 - an outcome we cannot record must not stop the worker
            transient = is_transient(exc)
            if transient:
                w.log(
                    logging.ERROR,
                    "giving up recording outcome; lease expiry will recover the run",
                    run_id=run_ids,
                    outcome=outcome,
                    error=describe_exception(exc),
                )
            else:
                w.log(
                    logging.ERROR,
                    "could not record outcome; the lease will expire and the run be retried",
                    run_id=run_ids,
                    outcome=outcome,
                    error=describe_exception(exc),
                )
                if note_failure:
                    self._note_unrecorded(runs, outcome, exc)
            raise NotRecorded(exc, transient=transient) from None

    def _note_unrecorded(self, runs: dict[int, int], outcome: str, exc: BaseException) -> None:
        """Best effort: tell the runs' history why they will be executed again."""
        w = self.worker
        try:
            outcomes.note_unrecorded(
                worker_id=w.worker_id, held=runs, outcome=outcome, error=describe_exception(exc), now=w.clock.now()
            )
        except Exception as note_exc:  # noqa: BLE001 - the log line already says it
            w.log(
                logging.WARNING,
                "could not note the unrecorded outcome in the run history",
                run_id=",".join(map(str, sorted(runs))),
                error=describe_exception(note_exc),
            )

    def _log_finished(self, attempt: Attempt, state: str | None, label: str = "lease_lost") -> None:
        """``label`` names a run not recorded as ``state``: lease_lost or unrecorded."""
        run = attempt.run
        level = logging.INFO if state in (RunState.SUCCEEDED, RunState.CANCELLED) else logging.WARNING
        if not self.worker.logs(level):  # one line per run: not even built when nobody logs it
            return
        error = attempt.error[:200] if attempt.error else None
        # The message itself names the outcome and the exception, so a handler that prints only
        # ``%(message)s`` (Python's default, a host project's own format) still says what failed.
        message, args = ("run finished (%s): %s", (state or label, error)) if error else ("run finished", ())
        self.worker.log(
            level,
            message,
            *args,
            run_id=run.pk,
            schedule=run.schedule.name if run.schedule is not None else None,
            task=run.task_name,
            attempt=run.attempts,
            state=state or label,
            duration=f"{attempt.duration:.3f}",
            error=error,
            error_class=attempt.error_class or None,
        )
