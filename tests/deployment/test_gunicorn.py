"""gunicorn serving the project with exactly the documented production environment, as behind the TLS proxy."""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys

import pytest
from django.views.defaults import ERROR_PAGE_TEMPLATE

from scheduler_project.startup import EXIT_CODE, NO_SECRET_KEY
from tests.concurrency.procs import finish, wait_for
from tests.deployment.docenv import ROOT, documented_environment, free_port, fresh_env

pytestmark = pytest.mark.slow

HOST = "scheduler.example.com"
NOT_FOUND = ERROR_PAGE_TEMPLATE % {
    "title": "Not Found",
    "details": "The requested resource was not found on this server.",
}


def gunicorn(port: int, variables: dict[str, str], tmp_path) -> subprocess.Popen:
    """The command of docs/deployment.md; the control socket (gunicorn >= 25) goes to tmp_path, not ~."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "scheduler_project.wsgi",
            "--preload",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "2",
        ],
        cwd=ROOT,
        env=fresh_env({**variables, "XDG_RUNTIME_DIR": str(tmp_path)}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def get(port: int, path: str, **headers: str) -> http.client.HTTPResponse:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", path, headers={"Host": HOST, **headers})
    response = connection.getresponse()
    response.body = response.read().decode()
    connection.close()
    return response


def test_gunicorn_serves_the_project_with_the_documented_environment(tmp_path):
    port = free_port()
    variables = {**documented_environment(), "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}"}
    server = gunicorn(port, variables, tmp_path)
    try:
        assert wait_for(lambda: accepts(port) or server.poll() is not None, timeout=20)
        assert server.poll() is None, server.communicate()[1]
        via_proxy = {"X-Forwarded-Proto": "https"}

        missing = get(port, "/no-such-page", **via_proxy)
        assert (missing.status, missing.body) == (404, NOT_FOUND)  # Django's plain page, not the debug one
        assert missing.getheader("Strict-Transport-Security") == "max-age=31536000; includeSubDomains; preload"

        login = get(port, "/admin/login/", **via_proxy)
        assert login.status == 200
        assert "; Secure" in login.getheader("Set-Cookie") and login.getheader("Set-Cookie").startswith("csrftoken=")

        assert get(port, "/api/stats", **via_proxy).status == 401

        plain = get(port, "/no-such-page")  # no X-Forwarded-Proto: a plain-HTTP request
        assert (plain.status, plain.getheader("Location")) == (301, f"https://{HOST}/no-such-page")

        other = get(port, "/admin/login/", Host="internal.example.net", **via_proxy)
        assert other.status == 400 and "Traceback" not in other.body
    finally:
        server.terminate()
        finish([server], timeout=20)


def test_gunicorn_without_a_secret_key_stops_at_once_with_the_reason(tmp_path):
    variables = documented_environment()
    del variables["DJANGO_SECRET_KEY"]
    ((code, _, stderr),) = finish([gunicorn(free_port(), variables, tmp_path)], timeout=20)
    assert code == EXIT_CODE
    assert stderr.splitlines().count(f"ImproperlyConfigured: {NO_SECRET_KEY}") == 1
    assert "Traceback" not in stderr
