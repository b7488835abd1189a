"""Every hostile input class through every operator entry point: a 4xx, a form error or a
one-line command error, never a 500, a traceback or a half-written row.

Input classes: unstorable text (NUL, lone surrogates), numbers too big for a float
or a column, ids of any length, a time zone on a non-cron schedule. Entry points:
REST, the ``distsched`` / ``runworker`` commands (in process and as a real process
with undecodable bytes in argv), the admin form. Rows that already hold such text
(SQLite keeps JSON escapes of surrogates) render in the API, admin, CLI and metrics.
"""

from __future__ import annotations

import json
import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.urls import reverse

from distsched_app.management.commands.distsched import Command
from distsched_app.models import Run, Schedule, Worker
from distsched_app.services import workers
from tests.concurrency.procs import ROOT, child_env
from tests.conftest import T0

pytestmark = pytest.mark.django_db

SURROGATE_JSON = "\\udcff"  # how a JSON body spells the lone surrogate U+DCFF
SURROGATE = "\udcff"
VALID = {"name": "s1", "task_name": "tests.noop", "interval_seconds": 60}
DEEP = "[" * 5000 + "]" * 5000  # json.loads: RecursionError
HUGE_INT = "9" * 5000  # json.loads: ValueError, past Python's integer string conversion limit


@pytest.fixture
def root_api(api_clock, make_api_user, token_client):
    return token_client(make_api_user("root", superuser=True))


def post_json_text(client, url: str, body: str, method: str = "POST"):
    """Send JSON text as written (a JSON encoder would refuse to emit a lone surrogate)."""
    return client.generic(method, url, body.encode("ascii"), content_type="application/json")


def body_with(**fields: str) -> str:
    """VALID as JSON text with some fields replaced by raw JSON snippets."""
    parts = [f'"{k}": {json.dumps(v)}' for k, v in VALID.items() if k not in fields]
    parts += [f'"{k}": {v}' for k, v in fields.items()]
    return "{" + ", ".join(parts) + "}"


# -- REST --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"name": f'"bad{SURROGATE_JSON}"'}, "name"),
        ({"task_name": f'"t{SURROGATE_JSON}"'}, "task_name"),
        ({"kwargs": f'{{"k": "v{SURROGATE_JSON}"}}'}, "kwargs"),
        ({"kwargs": f'{{"k{SURROGATE_JSON}": 1}}'}, "kwargs"),
        ({"args": '["nul\\u0000"]'}, "args"),
        ({"kwargs": '{"deep": [{"x": "\\ud800"}]}'}, "kwargs"),
        ({"queue": f'"q{SURROGATE_JSON}"'}, "queue"),
        ({"interval_seconds": "null", "cron": f'"0 3 * * {SURROGATE_JSON}"'}, "cron"),
        ({"interval_seconds": "null", "cron": '"0 3 * * *"', "timezone": f'"Europe/{SURROGATE_JSON}"'}, "timezone"),
        ({"retry_base_seconds": "1" + "0" * 400}, "retry_base_seconds"),
        ({"retry_jitter": "-1" + "0" * 400}, "retry_jitter"),
        ({"max_attempts": "1" + "0" * 400}, "max_attempts"),
        ({"interval_seconds": "1" + "0" * 400}, "interval_seconds"),
        ({"timezone": '"Europe/Paris"'}, "timezone"),
        ({"interval_seconds": "null", "cron": '"0 R * * *"'}, "cron"),
        ({"interval_seconds": "null", "cron": '"0 0 L * ?"'}, "cron"),
    ],
    ids=[
        "name",
        "task",
        "kwargs-value",
        "kwargs-key",
        "args-nul",
        "nested-surrogate",
        "queue",
        "cron",
        "zone",
        "huge-float",
        "huge-negative",
        "huge-int",
        "huge-interval",
        "zone-on-interval",
        "cron-random",
        "cron-quartz",
    ],
)
def test_rest_create_refuses_each_class_with_a_field_error(root_api, fields, field):
    response = post_json_text(root_api, "/api/schedules", body_with(**fields))
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert not Schedule.objects.exists()


def test_rest_update_refuses_unstorable_text_and_changes_nothing(root_api, make_schedule):
    make_schedule("s1", kwargs={"n": 1})
    response = post_json_text(root_api, "/api/schedules/s1", f'{{"kwargs": {{"n": "{SURROGATE_JSON}"}}}}', "PATCH")
    assert response.status_code == 400 and "kwargs" in response.json()
    assert Schedule.objects.get().kwargs == {"n": 1}


@pytest.mark.parametrize("run_id", ["9" * 30, "9" * 5000, "1" + "0" * 19, "-1", "0", "1e3", "٣"])
@pytest.mark.parametrize("suffix", ["", "/events"])
def test_rest_run_ids_of_any_length_are_404(root_api, run_id, suffix):
    assert root_api.get(f"/api/runs/{run_id}{suffix}").status_code == 404
    assert root_api.post(f"/api/runs/{run_id}/cancel").status_code == 404


@pytest.mark.parametrize("name", ["n" * 5000, "%00", "%ED%B3%BF", "%FF"])
def test_rest_schedule_names_of_any_length_or_bytes_are_404(root_api, name):
    assert root_api.get(f"/api/schedules/{name}").status_code == 404
    assert root_api.post(f"/api/schedules/{name}/trigger").status_code == 404


# -- the distsched and runworker commands -------------------------------------------------


def command_error(*args: str) -> str:
    command = Command()
    out = StringIO()
    with pytest.raises(CommandError) as info:
        call_command(command, *args, stdout=out, stderr=StringIO())
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message and out.getvalue() == ""
    message.encode("utf-8")  # printable on any terminal
    return message


@pytest.mark.parametrize(
    "args",
    [
        ["schedule", "create", f"bad{SURROGATE}", "--task", "tests.noop", "--interval", "60"],
        ["schedule", "create", "s", "--task", f"t{SURROGATE}", "--interval", "60"],
        ["schedule", "create", "s", "--task", "tests.noop", "--interval", "60", "--kwargs", '{"k": "\\udcff"}'],
        ["schedule", "create", "s", "--task", "tests.noop", "--interval", "60", "--args", '["\\u0000"]'],
        ["schedule", "create", "s", "--task", "tests.noop", "--interval", "60", "--queue", f"q{SURROGATE}"],
        ["schedule", "create", "s", "--task", "tests.noop", "--cron", "0 3 * * *", "--timezone", f"x{SURROGATE}"],
        ["schedule", "create", "s", "--task", "tests.noop", "--interval", "60", "--timezone", "Europe/Paris"],
        ["schedule", "create", "s", "--task", "tests.noop", "--interval", "9" * 400],
        ["schedule", "create", "s", "--task", "tests.noop", "--cron", "0 R * * *"],
        ["schedule", "create", "s", "--task", "tests.noop", "--cron", "0 0 1W * *"],
        ["schedule", "create", "s", "--task", "tests.noop", "--interval", "60", "--max-attempts", "9" * 400],
        ["schedule", "create", "s", "--task", "tests.noop", "--interval", "60", "--args", DEEP],
        ["schedule", "create", "s", "--task", "tests.noop", "--interval", "60", "--kwargs", f'{{"k": {DEEP}}}'],
        ["schedule", "create", "s", "--task", "tests.noop", "--interval", "60", "--args", f"[{HUGE_INT}]"],
        ["run", "enqueue", "tests.noop", "--args", DEEP],
        ["run", "enqueue", "tests.noop", "--kwargs", f'{{"n": {HUGE_INT}}}'],
        ["schedule", "show", f"s{SURROGATE}"],
        ["schedule", "pause", "s\x00"],
        ["run", "list", "--task", f"t{SURROGATE}"],
        ["run", "list", "--queue", "q\x00"],
        ["run", "list", "--limit", "9" * 30],
        ["run", "show", "9" * 30],
        ["run", "cancel", "9" * 5000],
        ["prune", "--older-than", "9" * 20 + "d"],
    ],
)
def test_distsched_command_refuses_each_class_in_one_line(args):
    command_error(*args)
    assert not Schedule.objects.exists() and not Run.objects.exists()


@pytest.mark.parametrize(
    "args",
    [
        ["--worker-id", f"w{SURROGATE}"],
        ["--worker-id", "w" * 201],
        ["--queues", f"default,q{SURROGATE}"],
        ["--lease-seconds", "1e300"],
        ["--poll-interval", "1e300"],
        ["--prefetch", "9" * 30],
        ["--concurrency", "100000"],
    ],
)
def test_runworker_refuses_bad_options_in_one_line(args):
    with pytest.raises(CommandError) as info:
        call_command("runworker", "--once", *args, stdout=StringIO(), stderr=StringIO())
    assert "\n" not in str(info.value)
    assert not Worker.objects.exists()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_undecodable_bytes_in_a_real_process_argv_give_one_line_and_exit_1():
    for argv in (
        [b"distsched", b"schedule", b"show", b"caf\xe9"],
        [b"runworker", b"--once", b"--worker-id", b"w-\xff"],
        [
            b"distsched",
            b"schedule",
            b"create",
            b"s",
            b"--task",
            b"tests.noop",
            b"--interval",
            b"60",
            b"--kwargs",
            b'{"k": "\xff"}',
        ],
    ):
        done = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *argv],
            cwd=ROOT,
            env=child_env(),
            capture_output=True,
            timeout=120,
        )
        stderr = done.stderr.decode("utf-8", "replace")
        assert done.returncode == 1, (argv, stderr)
        assert stderr.count("\n") == 1 and stderr.startswith("CommandError: "), (argv, stderr)
        assert "Traceback" not in stderr
    assert not Schedule.objects.exists() and not Worker.objects.exists()


# -- the admin form ----------------------------------------------------------------------


@pytest.fixture
def staff(admin_client, clock, monkeypatch):
    return admin_client


def schedule_form(**overrides: str) -> dict[str, str]:
    data = {
        "name": "new-one",
        "task_name": "tests.noop",
        "args": "[]",
        "kwargs": "{}",
        "interval_seconds": "60",
        "cron": "",
        "timezone": "UTC",
        "queue": "default",
        "max_attempts": "3",
        "retry_base_seconds": "10",
        "retry_max_seconds": "3600",
        "retry_jitter": "0",
        "catch_up": "one",
        "overlap": "allow",
    }
    data.update(overrides)
    return data


DEEP_OR_HUGE = [
    ({"args": DEEP}, "args"),
    ({"kwargs": f'{{"k": {DEEP}}}'}, "kwargs"),
    ({"args": "[" * 40 + "]" * 40}, "args"),
    ({"args": f"[{HUGE_INT}]"}, "args"),
    ({"kwargs": f'{{"n": {HUGE_INT}}}'}, "kwargs"),
]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"kwargs": '{"k": "\\udcff"}'}, "kwargs"),
        ({"kwargs": '{"k\\u0000": 1}'}, "kwargs"),
        ({"args": '["\\ud800"]'}, "args"),
        ({"name": "nul\x00name"}, "name"),
        ({"retry_base_seconds": "1e400"}, "retry_base_seconds"),
        ({"retry_max_seconds": "9" * 400}, "retry_max_seconds"),
        ({"max_attempts": "9" * 30}, "max_attempts"),
        ({"interval_seconds": "9" * 30}, "interval_seconds"),
        ({"timezone": "Europe/Paris"}, "timezone"),
        ({"interval_seconds": "", "cron": "0 R * * *"}, "cron"),
        ({"interval_seconds": "", "cron": "0 0 * * 5#3"}, "cron"),
        *DEEP_OR_HUGE,
    ],
)
def test_admin_form_refuses_each_class_on_its_field(staff, overrides, field):
    response = staff.post(reverse("admin:distsched_app_schedule_add"), schedule_form(**overrides))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert field in errors, errors
    assert not Schedule.objects.exists()


@pytest.mark.parametrize(("overrides", "field"), DEEP_OR_HUGE)
def test_admin_change_form_refuses_deep_or_huge_payloads_with_its_message(staff, make_schedule, overrides, field):
    schedule = make_schedule("kept", kwargs={"n": 1})
    response = staff.post(
        reverse("admin:distsched_app_schedule_change", args=[schedule.pk]), schedule_form(name="kept", **overrides)
    )
    assert response.status_code == 200
    [message] = response.context["adminform"].form.errors[field]
    assert message.startswith(field) and message in response.content.decode()
    assert Schedule.objects.get().kwargs == {"n": 1}


@pytest.mark.parametrize("object_id", ["9" * 30, "9" * 5000, "abc", "-1"])
def test_admin_urls_with_ids_of_any_length_are_not_server_errors(staff, object_id):
    for model in ("run", "runevent", "schedule"):
        response = staff.get(reverse(f"admin:distsched_app_{model}_changelist") + f"{object_id}/change/")
        assert response.status_code in (302, 404), (model, response.status_code)
    assert staff.post(reverse("admin:distsched_app_run_changelist") + f"{object_id}/cancel/").status_code == 404


CHANGELIST_QUERIES = [
    {"q": "nul\x00term"},
    {"task_name": "tests\x00noop"},
    {"queue": "\x00"},
    {"state": "pending\x00"},
    {"o": "1\x00"},
    {"worker_id": "w\x00"},
    {"event_type": "created\x00"},
    {"priority": "9" * 40},
]


@pytest.mark.parametrize("params", CHANGELIST_QUERIES, ids=lambda p: next(iter(p)))
@pytest.mark.parametrize("model", ["run", "runevent", "schedule", "worker"])
def test_admin_changelist_search_and_filters_with_unstorable_text_are_not_server_errors(
    staff, scheduler, make_schedule, model, params
):
    make_schedule("visible")
    scheduler.tick()
    response = staff.get(reverse(f"admin:distsched_app_{model}_changelist"), params)
    assert response.status_code in (200, 302), (model, params, response.status_code)
    if response.status_code == 302:  # Django's "invalid lookup" page, not a 500
        assert response["Location"].endswith("?e=1")
        assert staff.get(response["Location"]).status_code == 200


SEARCH_TERMS = {
    "superscript-two": "²",
    "circled-one": "①",
    "arabic-indic-three": "٣",
    "marked-superscript": "#²",
    "20-digits": "9" * 20,
    "4301-digits": "9" * 4301,
    "marked-5000-digits": "#" + "9" * 5000,
}


@pytest.mark.parametrize("term", SEARCH_TERMS.values(), ids=SEARCH_TERMS.keys())
@pytest.mark.parametrize("model", ["run", "runevent", "schedule", "worker"])
def test_admin_changelist_search_for_digits_no_id_can_be_is_text_not_a_server_error(
    staff, scheduler, make_schedule, model, term
):
    """``"²".isdigit()`` is true but ``int("²")`` fails, ``int("٣")`` is 3, and ``int()`` refuses
    more than 4,300 digits: none of them is a row id, so each is searched as text and finds nothing."""
    make_schedule("visible")
    scheduler.tick()
    workers.register_worker(worker_id="w1", hostname="h", pid=1, queues=["default"], now=T0)
    response = staff.get(reverse(f"admin:distsched_app_{model}_changelist"), {"q": term})
    assert response.status_code == 200, (model, response.status_code)
    assert response.context["cl"].result_count == 0


# -- a framework task's queue outside its backend's QUEUES, through every entry point -------


@pytest.fixture
def default_queue_only(settings):
    settings.TASKS = {**settings.TASKS, "default": {**settings.TASKS["default"], "QUEUES": ["default"]}}


FRAMEWORK_TASK = "tests.testapp.tasks.ft_noop"


def test_rest_refuses_a_framework_schedule_on_a_queue_its_backend_refuses(root_api, default_queue_only):
    body = {**VALID, "task_name": FRAMEWORK_TASK, "queue": "other"}
    response = root_api.post("/api/schedules", body, format="json")
    assert response.status_code == 400 and "QUEUES" in response.json()["queue"][0], response.json()
    assert not Schedule.objects.exists()


def test_admin_form_refuses_a_framework_schedule_on_a_queue_its_backend_refuses(staff, default_queue_only):
    response = staff.post(
        reverse("admin:distsched_app_schedule_add"), schedule_form(task_name=FRAMEWORK_TASK, queue="other")
    )
    assert response.status_code == 200
    assert "QUEUES" in response.context["adminform"].form.errors["queue"][0]
    assert not Schedule.objects.exists()


def test_distsched_command_refuses_a_framework_schedule_on_a_queue_its_backend_refuses(clock, default_queue_only):
    args = ["schedule", "create", "s", "--task", FRAMEWORK_TASK, "--interval", "60", "--queue", "other"]
    assert "QUEUES (default)" in command_error(*args)
    assert not Schedule.objects.exists()


# -- rows written before the rule (SQLite keeps surrogate escapes in JSON text) ----------


@pytest.fixture
def poison_rows(scheduler, make_schedule):
    """A schedule, a run and a worker whose JSON columns hold escapes of lone surrogates and NUL."""
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL's jsonb refuses these escapes: such rows cannot exist there")
    make_schedule("poison", task_name="tests.noop")
    [run] = scheduler.tick()
    workers.register_worker(worker_id="w1", hostname="h", pid=1, queues=["default"], now=T0)
    escaped = json.dumps  # ensure_ascii: the escapes are plain ASCII text in the column
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE distsched_app_schedule SET kwargs = %s, args = %s",
            [escaped({"k\ud800": "v\udcff"}), escaped(["\x00", "\udfff"])],
        )
        cursor.execute(
            "UPDATE distsched_app_run SET kwargs = %s, args = %s, result = %s",
            [escaped({"k": "\udcff"}), escaped(["\ud800"]), escaped({"r": "\udcff\x00"})],
        )
        cursor.execute("UPDATE distsched_app_worker SET queues = %s", [escaped(["q\udcff"])])
    return run


def test_poison_rows_render_in_the_api(root_api, poison_rows):
    for url in (
        "/api/runs",
        f"/api/runs/{poison_rows.pk}",
        "/api/schedules",
        "/api/schedules/poison",
        "/api/workers",
        "/api/stats",
        f"/api/runs/{poison_rows.pk}/events",
    ):
        response = root_api.get(url)
        assert response.status_code == 200, url
    run = root_api.get(f"/api/runs/{poison_rows.pk}").json()
    assert run["kwargs"] == {"k": "\\udcff"} and run["args"] == ["\\ud800"] and run["result"] == {"r": "\\udcff\\x00"}
    assert root_api.get("/api/workers").json()["results"][0]["queues"] == ["q\\udcff"]


def test_poison_rows_render_in_the_admin(staff, poison_rows):
    schedule = Schedule.objects.get()
    for url in (
        reverse("admin:distsched_app_run_changelist"),
        reverse("admin:distsched_app_run_change", args=[poison_rows.pk]),
        reverse("admin:distsched_app_schedule_changelist"),
        reverse("admin:distsched_app_schedule_change", args=[schedule.pk]),
        reverse("admin:distsched_app_worker_changelist"),
        reverse("admin:distsched_app_worker_change", args=["w1"]),
        reverse("admin:distsched_dashboard"),
    ):
        response = staff.get(url)
        assert response.status_code == 200, url
    assert "\\udcff" in staff.get(reverse("admin:distsched_app_run_change", args=[poison_rows.pk])).content.decode()


@pytest.mark.parametrize(
    "args",
    [["run", "list"], ["run", "show", "RUN"], ["schedule", "show", "poison"], ["schedule", "list"], ["worker", "list"]],
)
@pytest.mark.parametrize("as_json", [False, True])
def test_poison_rows_render_in_the_cli(poison_rows, clock, args, as_json):
    command = Command()
    out = StringIO()
    argv = [str(poison_rows.pk) if a == "RUN" else a for a in args] + (["--json"] if as_json else [])
    call_command(command, *argv, stdout=out, stderr=StringIO())
    out.getvalue().encode("utf-8")  # what a strict UTF-8 stdout would have to write
    if as_json:
        json.loads(out.getvalue())


def test_poison_rows_do_not_break_metrics(root_api, poison_rows):
    response = root_api.get("/metrics")
    assert response.status_code == 200 and b"distsched_runs" in response.content
