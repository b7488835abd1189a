"""Hostile input: oversized or deep payloads, odd names, and stored data that names code.

Complements tests/services/test_schedules.py (which covers the basic
validation errors). Runs on both databases: what PostgreSQL cannot store
(NUL characters) must be refused up front, not fail at INSERT time.
"""

from __future__ import annotations

import importlib
import os
import subprocess
from datetime import timedelta

import pytest

from distsched_app import errors
from distsched_app.conf import conf
from distsched_app.models import EventType, Origin, Run, RunEvent, RunState, Schedule
from tests.conftest import T0
from tests.testapp import tasks as test_tasks

pytestmark = pytest.mark.django_db


def create(scheduler, name="h", task_name="tests.noop", **options):
    if not {"interval_seconds", "cron", "run_at"} & set(options):
        options["interval_seconds"] = 60
    return scheduler.create_schedule(name=name, task_name=task_name, **options)


def nested(depth: int, leaf=0, kind=list):
    value = leaf
    for _ in range(depth - 1):
        value = [value] if kind is list else {"k": value}
    return value


# -- payload size and shape --------------------------------------------------------


@pytest.mark.parametrize("field", ["args", "kwargs"])
def test_payload_over_the_default_limit_is_rejected_with_a_clear_error(scheduler, field):
    blob = "x" * (conf.MAX_PAYLOAD_BYTES + 1)
    value = [blob] if field == "args" else {"blob": blob}
    with pytest.raises(errors.InvalidPayload) as info:
        create(scheduler, **{field: value})
    assert info.value.field == field
    assert str(info.value) == f"{field} is larger than {conf.MAX_PAYLOAD_BYTES} bytes"
    assert not Schedule.objects.exists()


def test_payload_limit_counts_encoded_bytes_not_characters(scheduler, settings):
    settings.DISTSCHED = {"MAX_PAYLOAD_BYTES": 100}
    create(scheduler, name="fits", kwargs={"s": "a" * 80})
    with pytest.raises(errors.InvalidPayload):
        create(scheduler, name="multibyte", kwargs={"s": "é" * 80})  # 80 characters, 6 bytes each as JSON


def test_payload_just_under_the_limit_is_accepted(scheduler, settings):
    settings.DISTSCHED = {"MAX_PAYLOAD_BYTES": 100}
    value = ["x" * 96]  # ["xxx..."] is 100 bytes
    schedule = create(scheduler, args=value)
    assert schedule.args == value


@pytest.mark.parametrize("kind", [list, dict])
def test_nesting_limit_is_exact(scheduler, settings, kind):
    settings.DISTSCHED = {"MAX_PAYLOAD_DEPTH": 8}
    field = "args" if kind is list else "kwargs"
    create(scheduler, name="ok", **{field: nested(8, kind=kind)})
    with pytest.raises(errors.InvalidPayload, match="nested deeper than 8 levels") as info:
        create(scheduler, name="deep", **{field: nested(9, kind=kind)})
    assert info.value.field == field


def test_pathologically_deep_payload_is_rejected_without_recursion_error(scheduler):
    # Deeper than Python's recursion limit: the check stops at MAX_PAYLOAD_DEPTH.
    with pytest.raises(errors.InvalidPayload, match="nested deeper"):
        create(scheduler, args=nested(50_000))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"nan": float("nan")},
        {"inf": float("inf")},
        {"bytes": b"raw"},
        {"set": {1, 2}},
        {"obj": object()},
        {1: "int key"},
        {"nested": {("tuple", "key"): 1}},
    ],
    ids=["nan", "inf", "bytes", "set", "object", "int-key", "tuple-key"],
)
def test_non_json_payloads_are_rejected(scheduler, kwargs):
    with pytest.raises(errors.InvalidPayload):
        create(scheduler, kwargs=kwargs)
    assert not Schedule.objects.exists()


@pytest.mark.parametrize(
    "value", [{"s": "nul\x00byte"}, {"nul\x00key": 1}, {"deep": [["\x00"]]}], ids=["value", "key", "nested"]
)
def test_nul_characters_are_rejected_on_every_database(scheduler, value):
    # PostgreSQL's jsonb cannot store \u0000: refuse it as input, on SQLite too, so a
    # schedule created on one backend is valid on the other.
    with pytest.raises(errors.InvalidPayload, match="NUL"):
        create(scheduler, kwargs=value)
    assert not Schedule.objects.exists()


def test_a_literal_backslash_u0000_text_is_fine(scheduler):
    schedule = create(scheduler, kwargs={"s": "\\u0000"})
    schedule.refresh_from_db()
    assert schedule.kwargs == {"s": "\\u0000"}


def test_update_with_oversized_payload_changes_nothing(scheduler):
    create(scheduler, name="u", kwargs={"small": 1})
    with pytest.raises(errors.InvalidPayload):
        scheduler.update_schedule("u", kwargs={"blob": "x" * (conf.MAX_PAYLOAD_BYTES + 1)})
    assert Schedule.objects.get(name="u").kwargs == {"small": 1}


# -- names -------------------------------------------------------------------------


def test_name_of_exactly_100_characters_is_accepted(scheduler):
    assert create(scheduler, name="n" * 100).name == "n" * 100


@pytest.mark.parametrize(
    "name",
    [
        "trailing-newline\n",
        "\nleading",
        "tab\tinside",
        "nul\x00",
        "dot.name",
        "../etc",
        "semi;colon",
        "n" * 101,
        None,
        42,
        "emoji-🙂",
    ],
    ids=[
        "trailing-newline",
        "leading-newline",
        "tab",
        "nul",
        "dot",
        "path",
        "semicolon",
        "101-chars",
        "none",
        "int",
        "emoji",
    ],
)
def test_names_must_be_slugs(scheduler, name):
    with pytest.raises(errors.InvalidName):
        create(scheduler, name=name)
    assert not Schedule.objects.exists()


@pytest.mark.parametrize("queue", ["default\n", "q" * 101, "", "a b", "a/b"])
def test_queue_names_are_validated(scheduler, queue):
    if queue == "":
        assert create(scheduler, queue=queue).queue == "default"  # empty means the default queue
        return
    with pytest.raises(errors.ValidationError) as info:
        create(scheduler, queue=queue)
    assert info.value.field == "queue"


@pytest.mark.parametrize("tz", ["../../../etc/passwd", "/etc/localtime", "localtime", "UTC\n", "x" * 500])
def test_timezone_cannot_name_a_file(scheduler, tz):
    with pytest.raises(errors.UnknownTimezone):
        create(scheduler, cron="0 3 * * *", timezone=tz)


@pytest.mark.parametrize("cron", ["* " * 5000, "0 3 * * * *", "0 3 * * * 2026", "@reboot"])
def test_hostile_cron_is_rejected(scheduler, cron):
    with pytest.raises(errors.InvalidCron):
        create(scheduler, cron=cron)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("max_attempts", 10**9),
        ("max_attempts", True),
        ("interval_seconds", 10**12),
        ("retry_base_seconds", float("nan")),
        ("retry_max_seconds", float("inf")),
        ("retry_jitter", -1),
    ],
)
def test_numbers_out_of_range_are_rejected(scheduler, option, value):
    options = {"interval_seconds": 60, option: value}
    with pytest.raises(errors.ValidationError):
        scheduler.create_schedule(name="num", task_name="tests.noop", **options)
    assert not Schedule.objects.exists()


# -- only registered tasks ever run ------------------------------------------------


@pytest.fixture
def spies(monkeypatch):
    """Record any attempt to run a shell command or import a module by name."""
    calls: list = []
    monkeypatch.setattr(os, "system", lambda *a, **k: calls.append(("os.system", a)) or 0)
    monkeypatch.setattr(os, "popen", lambda *a, **k: calls.append(("os.popen", a)))
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: calls.append(("subprocess.Popen", a)))
    real_import = importlib.import_module

    def import_module(name, *args, **kwargs):
        calls.append(("import_module", name))
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", import_module)
    return calls


@pytest.mark.parametrize(
    "task_name",
    [
        "os.system",
        "subprocess.Popen",
        "builtins.eval",
        "distsched_app.worker.os.system",
        "__import__('os')",
        "tests.echo ",
        "TESTS.ECHO",
    ],
)
def test_a_run_row_naming_arbitrary_code_is_never_imported_nor_executed(scheduler, clock, spies, task_name):
    schedule = create(scheduler, name="victim", task_name="tests.echo")
    # Written straight to the database, as an attacker with table access would.
    run = Run.objects.create(
        schedule=schedule,
        task_name=task_name,
        args=["touch /tmp/distsched-pwned"],
        kwargs={},
        state=RunState.PENDING,
        scheduled_for=clock.now(),
        available_at=clock.now(),
        max_attempts=1,
        origin=Origin.MANUAL,
        idempotency_key="manual:x",
        created_at=clock.now(),
        updated_at=clock.now(),
    )
    worker = scheduler.worker(worker_id="w", heartbeat_seconds=3600)
    execution = worker.run_once()
    run.refresh_from_db()
    # An unknown task: given back for a worker that has it, its attempt unused, nothing imported or run.
    assert execution.state == RunState.PENDING
    assert (run.state, run.attempts, run.last_error) == (RunState.PENDING, 0, "")
    assert RunEvent.objects.filter(run=run, event_type=EventType.RELEASED, data__task=task_name).exists()
    assert spies == []
    assert test_tasks.CALLS == []
    assert not os.path.exists("/tmp/distsched-pwned")


def test_a_schedule_row_edited_to_name_arbitrary_code_never_executes_it(scheduler, clock, spies):
    create(scheduler, name="edited", task_name="tests.noop", max_attempts=2, retry_base_seconds=1)
    Schedule.objects.filter(name="edited").update(task_name="os.system", args=["id"])
    [run] = scheduler.tick()
    worker = scheduler.worker(worker_id="w", heartbeat_seconds=3600)
    assert worker.run_once().state == RunState.PENDING  # given back: no worker has os.system
    clock.advance(seconds=5)
    assert worker.run_once() is None  # and this worker leaves the task's runs alone from then on
    assert spies == []
    run.refresh_from_db()
    assert (run.state, run.attempts) == (RunState.PENDING, 0)
    assert not RunEvent.objects.filter(run=run, event_type=EventType.FAILED).exists()


def test_stored_kwargs_cannot_forge_the_run_context(scheduler, clock):
    schedule = create(scheduler, name="forge", task_name="tests.context")
    Schedule.objects.filter(pk=schedule.pk).update(kwargs={"context": "forged"})
    scheduler.tick()
    worker = scheduler.worker(worker_id="w", heartbeat_seconds=3600)
    assert worker.run_once().state == RunState.SUCCEEDED
    context = test_tasks.CALLS[0]["context"]
    assert context.worker_id == "w" and context.attempt == 1


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [({"not": "a list"}, {}), ([], ["not", "an", "object"]), ([], {"unexpected": 1}), (["too", "many"], {})],
    ids=["args-object", "kwargs-list", "unexpected-kwarg", "too-many-args"],
)
def test_malformed_stored_arguments_fail_the_attempt_not_the_worker(scheduler, clock, args, kwargs):
    schedule = create(scheduler, name="mal", task_name="tests.noop", max_attempts=1)
    Schedule.objects.filter(pk=schedule.pk).update(args=args, kwargs=kwargs)
    scheduler.tick()
    create(scheduler, name="next", task_name="tests.echo")
    scheduler.tick()
    worker = scheduler.worker(worker_id="w", heartbeat_seconds=3600)
    assert worker.run(burst=True, install_signals=False) == 2
    states = dict(Run.objects.values_list("schedule__name", "state"))
    assert states == {"mal": RunState.DEAD, "next": RunState.SUCCEEDED}


def test_once_schedule_in_the_past_is_refused_but_far_future_is_fine(scheduler):
    with pytest.raises(errors.RunAtInPast):
        create(scheduler, run_at=T0 - timedelta(microseconds=1))
    assert create(scheduler, name="future", run_at=T0 + timedelta(days=3650)).next_run_at is not None
