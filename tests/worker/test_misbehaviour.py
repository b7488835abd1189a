"""Tasks that misbehave: the worker records the right outcome and keeps serving.

In-process with the fake clock where possible (extends tests/worker/test_worker.py);
real processes for what needs one: a task outliving its lease on a healthy
worker, and a poison task that kills the interpreter.
"""

from __future__ import annotations

import signal
import sys
from datetime import timedelta

import pytest

from distsched_app.models import EventType, Run, RunEvent, RunState
from distsched_app.registry import registry
from distsched_app.services.events import MAX_MESSAGE_CHARS
from distsched_app.services.outcomes import storable_result as jsonable_result
from distsched_app.services.outcomes import truncate_error
from tests.concurrency.procs import finish, manage, wait_for
from tests.conftest import T0
from tests.testapp.models import Execution

BOOT = 90  # seconds a child process may take to start on a loaded machine


class BrokenStr(Exception):
    def __str__(self):
        raise RuntimeError("__str__ is broken too")


class BrokenEverything(Exception):
    def __str__(self):
        raise RuntimeError("no str")

    def __repr__(self):
        raise RuntimeError("no repr")


class ExplodingDict(dict):
    """A return value that explodes when anyone (json.dumps) looks inside."""

    def items(self):
        raise RuntimeError("do not serialise me")

    def __iter__(self):
        raise RuntimeError("do not iterate me")


class Unrepresentable:
    def __repr__(self):
        raise RuntimeError("no repr either")


def _circular() -> list:
    loop: list = []
    loop.append(loop)
    return loop


def _raise(exc: BaseException):
    def task():
        raise exc

    return task


def _exit():
    sys.exit("task called sys.exit")


@pytest.fixture
def misbehaving():
    """Register ``tests.misbehaving`` for one test."""
    names = []

    def register(func):
        registry.register("tests.misbehaving", func)
        names.append("tests.misbehaving")

    yield register
    for name in names:
        registry.unregister(name)


def _misbehave_then_noop(scheduler, func, misbehaving, **options) -> tuple[Run, Run]:
    misbehaving(func)
    options.setdefault("max_attempts", 1)
    scheduler.create_schedule(name="a-bad", task_name="tests.misbehaving", interval_seconds=3600, **options)
    scheduler.create_schedule(name="b-good", task_name="tests.noop", interval_seconds=3600)
    scheduler.tick()
    bad = Run.objects.get(schedule__name="a-bad")
    good = Run.objects.get(schedule__name="b-good")
    worker = scheduler.worker(worker_id="w1", lease_seconds=30, heartbeat_seconds=3600)
    # The worker serves both runs in one burst: the first one does not stop it.
    assert worker.run(burst=True, install_signals=False) == 2
    bad.refresh_from_db()
    good.refresh_from_db()
    assert good.state == RunState.SUCCEEDED, "the worker stopped serving after a misbehaving task"
    started = RunEvent.objects.filter(event_type=EventType.STARTED).order_by("id")
    started = list(started.values_list("run_id", flat=True))
    assert started == [bad.pk, good.pk], "the misbehaving run was not the one executed first"
    return bad, good


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("func", "expected"),
    [
        (_raise(SystemExit(0)), "SystemExit"),
        (_exit, "SystemExit: task called sys.exit"),
        (_raise(KeyboardInterrupt()), "KeyboardInterrupt"),
        (_raise(GeneratorExit()), "GeneratorExit"),
        (_raise(BrokenStr()), "BrokenStr: <unprintable exception>"),
        (_raise(BrokenEverything()), "BrokenEverything: <unprintable exception>"),
        (_raise(RecursionError("maximum recursion depth exceeded")), "RecursionError"),
        (_raise(MemoryError()), "MemoryError"),
    ],
    ids=[
        "SystemExit(0)",
        "sys.exit",
        "KeyboardInterrupt",
        "GeneratorExit",
        "broken-str",
        "broken-str-and-repr",
        "RecursionError",
        "MemoryError",
    ],
)
def test_exceptions_from_task_code_are_failed_attempts(scheduler, misbehaving, func, expected):
    bad, _ = _misbehave_then_noop(scheduler, func, misbehaving)
    assert bad.state == RunState.DEAD
    assert bad.last_error.startswith(expected)
    assert "Traceback" in bad.last_error
    failed = RunEvent.objects.get(run=bad, event_type=EventType.FAILED)
    assert failed.message.startswith(expected)


@pytest.mark.django_db
def test_exception_with_nul_bytes_in_its_message_is_stored(scheduler, misbehaving):
    # PostgreSQL text cannot hold NUL: a raw message would make the outcome unrecordable.
    bad, _ = _misbehave_then_noop(scheduler, _raise(ValueError("binary\x00garbage")), misbehaving)
    assert bad.state == RunState.DEAD
    assert "binary" in bad.last_error and "garbage" in bad.last_error
    assert "\x00" not in bad.last_error
    assert RunEvent.objects.filter(run=bad, event_type=EventType.MARKED_DEAD).exists()


@pytest.mark.django_db
def test_gigantic_error_is_truncated_to_max_error_chars_keeping_head_and_tail(scheduler, misbehaving, settings):
    settings.DISTSCHED = {"MAX_ERROR_CHARS": 2000}
    message = "HEAD" + "x" * 5_000_000 + "TAIL"
    bad, _ = _misbehave_then_noop(scheduler, _raise(ValueError(message)), misbehaving)
    assert bad.state == RunState.DEAD
    assert len(bad.last_error) <= 2000
    assert bad.last_error.startswith("ValueError: HEAD")
    assert "characters truncated" in bad.last_error
    assert bad.last_error.rstrip().endswith("TAIL")  # the traceback's last line, where the raise is
    failed = RunEvent.objects.get(run=bad, event_type=EventType.FAILED)
    assert len(failed.message) <= MAX_MESSAGE_CHARS


@pytest.mark.django_db
def test_default_error_limit_applies(scheduler, misbehaving):
    bad, _ = _misbehave_then_noop(scheduler, _raise(ValueError("y" * 1_000_000)), misbehaving)
    assert 19_000 < len(bad.last_error) <= 20_000  # MAX_ERROR_CHARS default


@pytest.mark.parametrize("limit", [1, 10, 40, 41, 50, 100, 1000, 20_000])
@pytest.mark.parametrize("size", [0, 39, 1001, 123_456])
def test_truncate_error_never_exceeds_the_limit(limit, size):
    text = "".join(chr(65 + i % 26) for i in range(size))
    out = truncate_error(text, limit)
    assert len(out) <= limit
    if size <= limit:
        assert out == text
    elif limit >= 100:
        assert out[:10] == text[:10] and out[-10:] == text[-10:]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("value", "stored"),
    [
        ({1, 2}, {"repr": "{1, 2}"}),
        (float("nan"), {"repr": "nan"}),
        (T0, {"repr": repr(T0)}),
        (b"bytes", {"repr": "b'bytes'"}),
        (_circular(), {"repr": "[[...]]"}),
        (Unrepresentable(), {"repr": "<unrepresentable Unrepresentable>"}),
        (ExplodingDict(a=1), {"repr": "{'a': 1}"}),
        ({"text": "nul\x00inside"}, {"repr": "{'text': 'nul\\x00inside'}"}),
        ({"ok": [1, "two", None]}, {"ok": [1, "two", None]}),
    ],
    ids=["set", "nan", "datetime", "bytes", "circular", "unrepresentable", "exploding-dict", "nul", "json"],
)
def test_non_json_return_values_are_stored_as_a_bounded_repr(scheduler, misbehaving, value, stored):
    bad, _ = _misbehave_then_noop(scheduler, lambda: value, misbehaving)
    assert bad.state == RunState.SUCCEEDED
    assert bad.result == stored


@pytest.mark.django_db
def test_oversized_return_value_is_truncated(scheduler, misbehaving, settings):
    settings.DISTSCHED = {"MAX_PAYLOAD_BYTES": 1000}
    bad, _ = _misbehave_then_noop(scheduler, lambda: ["z" * 5000], misbehaving)
    assert bad.state == RunState.SUCCEEDED
    assert set(bad.result) == {"truncated"} and len(bad.result["truncated"]) <= 1000


def test_jsonable_result_returns_plain_json():
    # What is stored is what JSON decoding gives back, so the database write cannot fail on it.
    class Tuple(tuple):
        pass

    assert jsonable_result(Tuple((1, 2))) == [1, 2]
    assert jsonable_result({"a": (1, 2)}) == {"a": [1, 2]}


# -- real processes -------------------------------------------------------------


def _due_run(scheduler, clock, task_name: str, **options) -> Run:
    clock.set(T0 - timedelta(days=1))
    scheduler.create_schedule(name="real", task_name=task_name, run_at=T0, **options)
    clock.set(T0)
    [run] = scheduler.tick()
    return run


@pytest.mark.django_db(transaction=True)
def test_task_running_past_its_lease_keeps_it_while_the_worker_is_healthy(scheduler, clock):
    """Lease 2 s, task 5 s, heartbeat 0.5 s: renewal keeps the run; an idle rival never takes it."""
    run = _due_run(scheduler, clock, "tests.record", kwargs={"sleep": 5}, max_attempts=3)
    workers = [
        manage("runworker", f"--worker-id=w{i}", "--lease-seconds=2", "--heartbeat-seconds=0.5", "--poll-interval=0.05")
        for i in range(2)
    ]
    try:
        assert wait_for(lambda: Run.objects.get(pk=run.pk).state == RunState.SUCCEEDED, timeout=BOOT + 30)
    finally:
        for proc in workers:
            proc.send_signal(signal.SIGTERM)
        results = finish(workers, timeout=30)
    for code, _, stderr in results:
        assert code == 0, stderr[-2000:]
    run.refresh_from_db()
    assert run.attempts == 1
    kinds = list(RunEvent.objects.filter(run=run).values_list("event_type", flat=True))
    assert EventType.LEASE_EXPIRED not in kinds and EventType.LEASE_LOST not in kinds
    assert Execution.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_poison_task_that_kills_the_interpreter_ends_dead_after_max_attempts(scheduler, clock):
    """Each execution kills its worker; a supervisor restarts workers; after max_attempts
    the expired lease marks the run dead instead of running it again."""
    run = _due_run(scheduler, clock, "tests.crash", max_attempts=3)
    codes = []
    for _ in range(12):  # a supervisor restarting crashed workers
        if Run.objects.get(pk=run.pk).state == RunState.DEAD:
            break
        proc = manage(
            "runworker",
            "--worker-id=victim",
            "--lease-seconds=1",
            "--heartbeat-seconds=0.25",
            "--poll-interval=0.05",
            "--once",
        )
        # --once: exits 0 if the lease has not expired yet (nothing due), or dies in the task.
        [(code, _, stderr)] = finish([proc], timeout=BOOT)
        codes.append(code)
        assert code in (0, 17), stderr[-2000:]
        if code == 0:
            wait_for(lambda: False, timeout=1)  # nothing due yet: let the lease run out
    run.refresh_from_db()
    assert run.state == RunState.DEAD, codes
    assert codes.count(17) == 3
    assert sorted(Execution.objects.values_list("attempt", flat=True)) == [1, 2, 3]
    kinds = list(RunEvent.objects.filter(run=run).order_by("id").values_list("event_type", flat=True))
    assert kinds.count(EventType.LEASE_EXPIRED) == 3
    assert kinds[-1] == EventType.MARKED_DEAD
    assert "lease expired with no attempts left" in run.last_error
