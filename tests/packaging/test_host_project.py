"""The reusable app in someone else's project: wheel -> fresh venv -> startproject -> a run succeeds.

Runs the blocks of docs/howto/install.md ("Installing into an existing Django
project") as a user pastes them: the Python blocks by the file their first line names
(``# settings.py`` is appended, the others written), the shell blocks in
order (all but the ``pip install`` one, which installing the wheel replaces).
Then the host project's own server answers ``/metrics`` with the token the
page makes for Prometheus.
"""

from __future__ import annotations

import http.client
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "howto" / "install.md"

pytestmark = pytest.mark.slow

CHECK = """
from distsched_app.models import Run
run = Run.objects.get()
print(run.state, run.result, run.events.count())
"""


def page_snippets() -> tuple[dict[str, str], list[str]]:
    """The page's files, keyed by the path their first line names, and its shell blocks."""
    section = PAGE.read_text()
    files, shell = {}, []
    for lang, body in re.findall(r"^```(\w+)\n(.*?)^```$", section, re.MULTILINE | re.DOTALL):
        if lang == "python":
            caption = re.match(r"# (\S+)\n", body)
            assert caption, f"a Python block of {PAGE.name} does not name its file:\n{body}"
            files[caption.group(1)] = body
        elif lang == "bash" and not body.startswith("pip install"):
            shell.append(body)
    return files, shell


def clean_env(venv: Path | None = None) -> dict[str, str]:
    """The host project must not see this suite's settings or database; ``python`` is the venv's."""
    drop = {"DJANGO_SETTINGS_MODULE", "DATABASE_URL", "PYTHONPATH", "VIRTUAL_ENV"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    if venv is not None:
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def run(cmd: list[str], cwd: Path, timeout: float = 600, venv: Path | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=clean_env(venv))
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(port: int, path: str, token: str | None = None) -> http.client.HTTPResponse:
    """One GET, redirects not followed; the response is read (``.body``)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", path, headers={"Authorization": f"Token {token}"} if token else {})
    response = connection.getresponse()
    response.body = response.read().decode()
    connection.close()
    return response


def wait_until_serving(server: subprocess.Popen, port: int, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.poll() is None, f"runserver exited:\n{log.read_text()[-3000:]}"
        try:
            get(port, "/metrics")
            return
        except OSError:
            time.sleep(0.1)  # the server is still starting: nothing else to wait on
    pytest.fail(f"runserver did not answer within {timeout}s:\n{log.read_text()[-3000:]}")


def test_page_snippets_cover_the_host_project():
    files, shell = page_snippets()
    assert set(files) == {"settings.py", "urls.py", "myapp/tasks.py"}
    assert len(shell) == 3
    assert "from django.urls import include, path" in files["urls.py"]
    assert '"myapp",' in files["settings.py"] and "DistschedFormatter" in files["settings.py"]
    assert "greet.enqueue" in shell[1] and "TASKS" in files["settings.py"]
    assert "drf_create_token prometheus" in shell[2]


@pytest.mark.sqlite_project
def test_wheel_installs_into_a_fresh_project_and_runs_a_task(tmp_path: Path):
    files, shell = page_snippets()
    dist = tmp_path / "dist"
    run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(dist)], cwd=tmp_path)
    [wheel] = dist.glob("distsched-*.whl")
    listing = run([sys.executable, "-m", "zipfile", "-l", str(wheel)], cwd=tmp_path).stdout
    package = ROOT / "distsched_app"
    shipped = [
        p
        for p in package.rglob("*")
        if p.is_file()
        and "__pycache__" not in p.parts
        and (p.suffix in {".html", ".css", ".js", ".svg"} or "migrations" in p.parts)
    ]
    assert any("migrations" in p.parts for p in shipped)
    for path in shipped:
        name = path.relative_to(ROOT).as_posix()
        assert name in listing, f"{name} missing from the wheel"

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    python = str(venv / "bin" / "python")
    run([python, "-m", "pip", "install", "-q", str(wheel)], cwd=tmp_path)

    site = tmp_path / "site"
    site.mkdir()
    run([str(venv / "bin" / "django-admin"), "startproject", "host", str(site)], cwd=tmp_path)
    run([python, "manage.py", "startapp", "myapp"], cwd=site)
    with (site / "host" / "settings.py").open("a") as settings:
        settings.write("\n" + files["settings.py"])
    (site / "host" / "urls.py").write_text(files["urls.py"])
    (site / "myapp" / "tasks.py").write_text(files["myapp/tasks.py"])

    run([python, "manage.py", "check"], cwd=site)
    first_run = run(["bash", "-euo", "pipefail", "-c", shell[0]], cwd=site, venv=venv)
    assert "created 1 run(s)" in first_run.stdout
    [finished] = [line for line in first_run.stderr.splitlines() if " INFO run finished " in line]
    assert "task=myapp.hello" in finished and "state=succeeded" in finished, first_run.stderr
    last_line = run([python, "manage.py", "shell", "-c", CHECK], cwd=site).stdout.strip().splitlines()[-1]
    assert last_line.split() == ["succeeded", "hello", "world", "4"]

    enqueued = run(["bash", "-euo", "pipefail", "-c", shell[1]], cwd=site, venv=venv)
    assert "enqueued run" in enqueued.stdout
    [finished] = [line for line in enqueued.stderr.splitlines() if " INFO run finished " in line]
    assert "task=myapp.tasks.greet" in finished and "state=succeeded" in finished, enqueued.stderr

    made_token = run(["bash", "-euo", "pipefail", "-c", shell[2]], cwd=site, venv=venv)
    token = re.search(r"Generated token (\w+) for user prometheus", made_token.stdout).group(1)

    port, log = free_port(), tmp_path / "runserver.log"
    with log.open("w") as output:
        server = subprocess.Popen(
            [python, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
            cwd=site,
            env=clean_env(),
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until_serving(server, port, log)
        scrape = get(port, "/metrics", token)
        assert scrape.status == 200, scrape.body
        assert scrape.getheader("Content-Type").startswith("text/plain")
        assert 'distsched_runs{origin="schedule",queue="default",state="succeeded"} 1.0' in scrape.body
        assert 'distsched_runs{origin="enqueued",queue="default",state="succeeded"} 1.0' in scrape.body
        anonymous = get(port, "/metrics")
        assert (anonymous.status, anonymous.getheader("WWW-Authenticate")) == (401, "Token")
        assert get(port, "/api/schedules", token).status == 403  # the metrics permission only
        docs = get(port, "/api/docs")
        assert (docs.status, docs.getheader("Location")) == (302, "/admin/login/?next=/api/docs")
    finally:
        server.terminate()
        server.wait(timeout=30)
