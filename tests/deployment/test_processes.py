"""The project's own processes (``manage.py``, the WSGI and ASGI modules) in fresh environments.

Each child sees only ``PATH`` and the variables a test gives it, so the project's
settings (not ``tests.settings``) and its production defaults apply.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from django.views.defaults import ERROR_PAGE_TEMPLATE

from distsched_app.clock import SystemClock
from distsched_app.models import Run, RunState
from distsched_app.services import schedules
from scheduler_project.startup import EXIT_CODE, NO_SECRET_KEY
from tests.concurrency.procs import database_url, finish
from tests.deployment.docenv import documented_environment, free_port, start

REFUSAL = f"ImproperlyConfigured: {NO_SECRET_KEY}\n"


def without_key() -> dict[str, str]:
    variables = documented_environment()
    del variables["DJANGO_SECRET_KEY"]
    return variables


def test_check_deploy_is_clean_with_exactly_the_documented_environment():
    documented = start(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], documented_environment())
    bare = start(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], {})
    (code, stdout, stderr), (bare_code, _, bare_stderr) = finish([documented, bare], timeout=120)
    assert (code, stderr) == (0, ""), stderr
    assert stdout == "System check identified no issues (0 silenced).\n"
    # Without it, the same check fails: the test above can fail.
    assert bare_code != 0
    assert "security.W009" in bare_stderr and "security.W004" in bare_stderr  # no key, no HSTS


def test_without_a_secret_key_the_web_entry_points_refuse_to_start_with_one_line():
    variables = without_key()
    procs = [
        start(["-c", "import scheduler_project.wsgi"], variables),
        start(["-c", "import scheduler_project.asgi"], variables),
        start(["manage.py", "runserver", f"127.0.0.1:{free_port()}"], variables),  # with the autoreloader
        start(["manage.py", "runserver", "--noreload", f"127.0.0.1:{free_port()}"], variables),
    ]
    for code, stdout, stderr in finish(procs, timeout=60):
        assert (code, stdout, stderr) == (EXIT_CODE, "", REFUSAL)


@pytest.mark.django_db(transaction=True)
def test_without_a_secret_key_workers_and_commands_run():
    now = SystemClock().now()
    schedules.create_schedule(
        name="summary", task_name="demo.daily_summary", kwargs={"account_id": 1}, interval_seconds=3600, now=now
    )
    run = schedules.trigger_schedule("summary", now=now)  # claimed first: oldest, and the lowest id
    variables = {**without_key(), "DATABASE_URL": database_url(), "DISTSCHED_LOG_LEVEL": "WARNING"}
    # migrate, then the tick alone: a tick passes over a schedule row another transaction has locked
    # (SKIP LOCKED; the next tick makes its slot), and the processes below start at once.
    for command in (["migrate", "--noinput"], ["tick"]):
        ((code, _, stderr),) = finish([start(["manage.py", *command], variables)], timeout=120)
        assert code == 0, (command, stderr)
    commands = [
        ["check"],
        ["makemigrations", "--check", "--dry-run"],
        ["distsched", "stats", "--json"],
        ["runworker", "--once", "--worker-id", "no-key"],
    ]
    results = finish([start(["manage.py", *command], variables) for command in commands], timeout=120)
    for command, (code, _, stderr) in zip(commands, results, strict=True):
        assert code == 0, (command, stderr)
    assert json.loads(results[2][1])["runs_by_state"]
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED
    assert run.events.filter(event_type="succeeded", worker_id="no-key").exists()
    assert Run.objects.filter(schedule__name="summary", origin="schedule").count() == 1  # the tick's first slot


def test_a_malformed_variable_stops_every_process_with_one_line():
    variables = {**documented_environment(), "DJANGO_SECURE_SSL_REDIRECT": "yes"}
    line = "ImproperlyConfigured: DJANGO_SECURE_SSL_REDIRECT must be 0 or 1, not 'yes'\n"
    procs = [
        start(["manage.py", "check"], variables),
        start(["manage.py", "runworker", "--once"], variables),
        start(["-c", "import scheduler_project.wsgi"], variables),
    ]
    for code, stdout, stderr in finish(procs, timeout=60):
        assert (code, stdout, stderr) == (EXIT_CODE, "", line)


# Calls the project's WSGI application once, as a server would, and prints status and body.
REQUEST = textwrap.dedent(
    """
    import json
    from wsgiref.util import setup_testing_defaults
    from scheduler_project.wsgi import application

    environ = {"PATH_INFO": "/no-such-page", "HTTP_HOST": "scheduler.example.com", "HTTP_X_FORWARDED_PROTO": "https"}
    setup_testing_defaults(environ)
    status = []
    body = b"".join(application(environ, lambda line, headers, exc_info=None: status.append(line)))
    print(json.dumps({"status": status[0], "body": body.decode()}))
    """
)


def test_an_anonymous_request_for_an_unknown_url_gets_the_plain_404_not_the_debug_page(tmp_path):
    variables = {**documented_environment(), "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}"}
    production = start(["-c", REQUEST], variables)
    debug = start(["-c", REQUEST], {**variables, "DJANGO_DEBUG": "1"})
    (code, stdout, stderr), (debug_code, debug_stdout, debug_stderr) = finish([production, debug], timeout=60)
    assert code == 0, stderr
    response = json.loads(stdout)
    assert response["status"] == "404 Not Found"
    assert response["body"] == ERROR_PAGE_TEMPLATE % {
        "title": "Not Found",
        "details": "The requested resource was not found on this server.",
    }
    # The same request in debug mode shows Django's technical page: the assertion above can fail.
    assert debug_code == 0, debug_stderr
    assert "Using the URLconf defined in" in json.loads(debug_stdout)["body"]
