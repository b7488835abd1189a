"""Unstorable text, huge numbers and out-of-place options through the Python API.

Each input class is refused with a typed error and writes nothing, identically on
SQLite and PostgreSQL (the suite runs on both); what tasks produce is stored
escaped, never lost and never a crash. Complements test_hostile_input.py.
"""

from __future__ import annotations

import os
from datetime import timedelta

import pytest

from distsched_app import errors
from distsched_app.models import EventType, Run, RunEvent, RunState, Schedule, Worker
from distsched_app.registry import registry
from distsched_app.services import maintenance, runs, schedules
from tests.conftest import T0

pytestmark = pytest.mark.django_db

SURROGATE = os.fsdecode(b"\xff")  # "\udcff": an undecodable byte in argv or a file name
UNSTORABLE = {"nul": "a\x00b", "surrogate": f"caf{SURROGATE}", "astral-pair": "\ud83d\ude00"}


def create(scheduler, name="h", **options):
    if not {"interval_seconds", "cron", "run_at"} & set(options):
        options["interval_seconds"] = 60
    return scheduler.create_schedule(name=name, task_name=options.pop("task_name", "tests.noop"), **options)


# -- inbound: refused, nothing written --------------------------------------------------


@pytest.mark.parametrize("kind", UNSTORABLE)
@pytest.mark.parametrize(
    ("where", "options"),
    [
        ("args", lambda t: {"args": [t]}),
        ("kwargs", lambda t: {"kwargs": {"k": t}}),
        ("kwargs", lambda t: {"kwargs": {t: 1}}),
        ("kwargs", lambda t: {"kwargs": {"deep": [[{"x": t}]]}}),
    ],
    ids=["args-value", "kwargs-value", "kwargs-key", "nested"],
)
def test_unstorable_payload_text_is_refused_with_a_typed_error(scheduler, kind, where, options):
    with pytest.raises(errors.InvalidPayload) as info:
        create(scheduler, **options(UNSTORABLE[kind]))
    assert info.value.field == where and "cannot be stored" in info.value.message
    assert not Schedule.objects.exists()


@pytest.mark.parametrize("kind", UNSTORABLE)
@pytest.mark.parametrize("option", ["name", "task_name", "queue", "timezone", "cron"])
def test_unstorable_text_in_any_schedule_field_is_a_typed_error(scheduler, kind, option):
    value = UNSTORABLE[kind]
    options = {"cron": "0 3 * * *", "timezone": value} if option == "timezone" else {option: value}
    with pytest.raises(errors.ValidationError):
        create(scheduler, **options)
    assert not Schedule.objects.exists()


@pytest.mark.parametrize("kind", UNSTORABLE)
def test_update_with_unstorable_text_changes_nothing(scheduler, kind):
    create(scheduler, name="u", kwargs={"n": 1})
    with pytest.raises(errors.InvalidPayload):
        scheduler.update_schedule("u", kwargs={"n": UNSTORABLE[kind]})
    assert Schedule.objects.get(name="u").kwargs == {"n": 1}


@pytest.mark.parametrize("kind", UNSTORABLE)
@pytest.mark.parametrize("action", ["get_schedule", "pause", "resume", "trigger", "delete_schedule", "upcoming"])
def test_an_unstorable_schedule_name_is_simply_not_found(scheduler, kind, action):
    with pytest.raises(errors.ScheduleNotFound):
        getattr(scheduler, action)(UNSTORABLE[kind])


@pytest.mark.parametrize("run_id", [0, -1, 2**63, 10**30, "1", None, 1.5])
@pytest.mark.parametrize("action", ["get_run", "cancel_run", "requeue_run"])
def test_run_ids_of_any_size_or_type_are_not_found(scheduler, run_id, action):
    with pytest.raises(errors.RunNotFound):
        getattr(scheduler, action)(run_id)


@pytest.mark.parametrize("kind", UNSTORABLE)
def test_unstorable_worker_ids_and_queues_are_refused_before_the_worker_starts(scheduler, kind):
    with pytest.raises(errors.ValidationError) as info:
        scheduler.worker(worker_id=f"w-{UNSTORABLE[kind]}")
    assert info.value.field == "worker_id"
    with pytest.raises(errors.ValidationError) as info:
        scheduler.worker(queues=["default", UNSTORABLE[kind]])
    assert info.value.field == "queues"
    assert not Worker.objects.exists()


@pytest.mark.parametrize("worker_id", ["w" * 201, "line\nbreak", "tab\there", 42])
def test_worker_ids_are_bounded_and_printable(scheduler, worker_id):
    with pytest.raises(errors.ValidationError):
        scheduler.worker(worker_id=worker_id)


# -- numbers -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("retry_base_seconds", 10**400),
        ("retry_max_seconds", 10**400),
        ("retry_jitter", 10**400),
        ("retry_base_seconds", -(10**400)),
        ("max_attempts", 10**400),
        ("interval_seconds", 10**400),
        ("max_attempts", 1e308),
        ("interval_seconds", float("nan")),
        ("retry_jitter", float("-inf")),
        ("max_attempts", 0),
        ("max_attempts", "3"),
        ("interval_seconds", 1.5),
    ],
)
def test_numbers_of_any_size_give_a_typed_error_not_an_overflow(scheduler, option, value):
    options = {"interval_seconds": 60, option: value}
    with pytest.raises(errors.ValidationError) as info:
        create(scheduler, **options)
    assert info.value.field == option
    assert not Schedule.objects.exists()


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("lease_seconds", 10**400),
        ("lease_seconds", 0),
        ("lease_seconds", float("inf")),
        ("lease_seconds", 1e9),
        ("poll_interval", -1),
        ("poll_interval", 1e300),
        ("heartbeat_seconds", float("nan")),
        ("prefetch", 0),
        ("prefetch", 10**6),
        ("prefetch", 2.5),
        ("concurrency", 0),
        ("concurrency", 10**6),
    ],
)
def test_worker_options_are_range_checked(scheduler, option, value):
    with pytest.raises(errors.ValidationError) as info:
        scheduler.worker(**{option: value})
    assert info.value.field == option


@pytest.mark.parametrize("older_than", [timedelta(days=999_999_999), timedelta(days=-1)])
def test_prune_with_an_absurd_age_is_a_typed_error(older_than):
    with pytest.raises(errors.ValidationError):
        maintenance.prune_runs(older_than=older_than, now=T0)


# -- out-of-place options ----------------------------------------------------------------


@pytest.mark.parametrize("spec", [{"interval_seconds": 60}, {"run_at": T0 + timedelta(days=1)}])
def test_a_timezone_on_a_non_cron_schedule_is_refused(scheduler, spec):
    with pytest.raises(errors.ValidationError, match="cron schedules only") as info:
        create(scheduler, timezone="Europe/Paris", **spec)
    assert info.value.field == "timezone"
    assert create(scheduler, timezone="UTC", **spec).timezone == "UTC"  # the stored default is fine


def test_leaving_cron_drops_the_zone_and_switching_back_keeps_a_given_one(scheduler):
    create(scheduler, name="c", cron="0 3 * * *", timezone="Europe/Paris")
    assert scheduler.update_schedule("c", interval_seconds=600).timezone == "UTC"
    assert scheduler.update_schedule("c", cron="0 4 * * *", timezone="Asia/Tokyo").timezone == "Asia/Tokyo"
    assert scheduler.update_schedule("c", cron="0 5 * * *").timezone == "Asia/Tokyo"  # same kind: kept
    with pytest.raises(errors.ValidationError, match="cron schedules only"):
        scheduler.update_schedule("c", interval_seconds=60, timezone="Asia/Tokyo")
    assert Schedule.objects.get(name="c").cron == "0 5 * * *"


# -- outbound: what tasks produce is stored escaped ------------------------------------


@pytest.fixture
def hostile_task():
    def register(func):
        registry.register("tests.hostile-output", func)
        return "tests.hostile-output"

    yield register
    registry.unregister("tests.hostile-output")


class SurrogateError(Exception):
    pass


@pytest.mark.parametrize(
    ("func", "state", "check"),
    [
        (
            lambda: (_ for _ in ()).throw(SurrogateError(f"bad file {SURROGATE}\x00")),
            RunState.DEAD,
            lambda run: "bad file \\udcff\\x00" in run.last_error,
        ),
        (lambda: f"name {SURROGATE}", RunState.SUCCEEDED, lambda run: run.result == {"repr": "'name \\udcff'"}),
        (lambda: {SURROGATE: "key"}, RunState.SUCCEEDED, lambda run: run.result == {"repr": "{'\\udcff': 'key'}"}),
        (
            lambda: ["ok", {"nested": "\x00"}],
            RunState.SUCCEEDED,
            lambda run: run.result == {"repr": "['ok', {'nested': '\\x00'}]"},
        ),
    ],
    ids=["exception-message", "returned-text", "returned-key", "returned-nul"],
)
def test_unstorable_task_output_is_stored_escaped_and_the_worker_goes_on(scheduler, hostile_task, func, state, check):
    create(scheduler, name="a-bad", task_name=hostile_task(func), max_attempts=1)
    create(scheduler, name="b-next")
    scheduler.tick()
    assert scheduler.worker(worker_id="w", heartbeat_seconds=3600).run(burst=True, install_signals=False) == 2
    bad = Run.objects.get(schedule__name="a-bad")
    assert bad.state == state and check(bad)
    assert Run.objects.get(schedule__name="b-next").state == RunState.SUCCEEDED
    if state == RunState.DEAD:
        failed = RunEvent.objects.get(run=bad, event_type=EventType.FAILED)
        assert "\\udcff" in failed.message


def test_an_operator_name_with_unstorable_text_is_escaped_in_the_history(scheduler):
    create(scheduler, name="s")
    [run] = scheduler.tick()
    runs.cancel_run(run.pk, now=T0, actor=f"ops-{SURROGATE}")
    event = RunEvent.objects.get(run=run, event_type=EventType.CANCELLED)
    assert event.message == "cancelled by ops-\\udcff"


def test_a_hostname_with_unstorable_text_is_escaped(scheduler, monkeypatch):
    import socket

    monkeypatch.setattr(socket, "gethostname", lambda: f"host-{SURROGATE}" + "h" * 300)
    worker = scheduler.worker()
    assert worker.worker_id.startswith("host-\\udcff")
    worker.register()
    stored = Worker.objects.get()
    assert stored.hostname.startswith("host-\\udcff") and len(stored.hostname) == 255
    assert schedules.list_schedules() == []
