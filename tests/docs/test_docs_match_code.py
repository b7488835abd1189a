"""The README and the docs site name only settings, commands, endpoints and metrics that exist."""

from __future__ import annotations

import re
from io import StringIO
from pathlib import Path

import pytest
from django.apps import apps
from django.core.management import call_command, get_commands
from django.urls import Resolver404, resolve

from distsched_app.backends import OPTION_NAMES
from distsched_app.conf import DEFAULTS

ROOT = Path(__file__).resolve().parents[2]
# Hand-written pages only: docs/_generated (made from the code at build time) and docs/_build are not read.
PAGES = [p for p in sorted((ROOT / "docs").rglob("*.md")) if not any(part.startswith("_") for part in p.parts)]
DOCS = [ROOT / "README.md", ROOT / "CHANGELOG.md", *PAGES]
TEXT = {path.relative_to(ROOT).as_posix(): path.read_text() for path in DOCS}


def test_every_setting_is_documented_and_every_documented_setting_exists():
    table = re.findall(r"^\| `([A-Z_]+)` \|", TEXT["docs/reference/settings.md"], re.MULTILINE)
    assert set(table) == set(DEFAULTS), set(table) ^ set(DEFAULTS)


def test_every_event_type_and_run_state_is_documented():
    from distsched_app.models import EventType, RunState

    text = TEXT["docs/reference/events.md"]
    events = text.split("## Event types", 1)[1].split("\n## ", 1)[0]
    states = text.split("## Run states", 1)[1]
    assert set(re.findall(r"^\| `([a-z_]+)` \|", events, re.MULTILINE)) == set(EventType.values)
    assert set(re.findall(r"^\| `([a-z_]+)` \|", states, re.MULTILINE)) == set(RunState.values)


TASKS_KEYS = {"BACKEND", "QUEUES", "OPTIONS"}
PEERS_COMMANDS = {"db_worker", "prune_db_task_results", "qcluster", "qinfo"}  # django-tasks-db, django-q2
DJANGO_DATABASE_KEYS = {"DISABLE_SERVER_SIDE_CURSORS"}


def test_settings_named_anywhere_exist():
    for name, text in TEXT.items():
        for key in re.findall(r'DISTSCHED\[\s*"([A-Z_]+)"\s*\]', text) + re.findall(r'"([A-Z_]{6,})":', text):
            if key.startswith(("DISTSCHED", "DATABASE", "REST", "DEFAULT", "SWAGGER")):
                continue
            if key in TASKS_KEYS or key in OPTION_NAMES or key in DJANGO_DATABASE_KEYS:  # Django's, our backend's
                continue
            assert key in DEFAULTS, f"{name} mentions unknown setting {key}"


def test_commands_named_in_docs_exist():
    commands = get_commands()
    for name, text in TEXT.items():
        for command in set(re.findall(r"manage\.py ([a-z_]+)", text)):
            if command in PEERS_COMMANDS:  # the migration guide names the commands it replaces
                continue
            assert command in commands, f"{name} mentions unknown command {command}"


@pytest.mark.django_db
def test_distsched_subcommands_in_docs_exist():
    groups = {
        "schedule": {
            *("create", "list", "show", "update", "pause", "resume", "trigger", "delete", "history", "restore"),
            "apply",
        },
        "run": {"enqueue", "list", "show", "cancel", "requeue"},
        "worker": {"list"},
        "queue": {"pause", "resume", "list", "history"},
        "limit": {"list", "show", "set", "reset"},
        "workflow": {"list", "show", "cancel"},
    }
    for name, text in TEXT.items():
        for group, verb in re.findall(r"distsched (schedule|run|worker|queue|limit|workflow) ([a-z]+)", text):
            assert verb in groups[group], f"{name}: distsched {group} {verb}"
    out = StringIO()
    call_command("distsched", "stats", stdout=out)
    assert out.getvalue()


def test_api_paths_in_docs_resolve():
    paths = set()
    for text in TEXT.values():
        paths |= set(re.findall(r"(?:\$API|/api)(/[a-z_/{}0-9-]*)", text))
    paths.discard("/")  # "under /api/": the prefix itself
    assert len(paths) > 10
    for path in sorted(paths):
        concrete = re.sub(r"\{[^}]+\}", "x", path).replace("/17", "/1").replace("nightly-report", "x")
        concrete = re.sub(r"/runs/x", "/runs/1", concrete)
        try:
            match = resolve("/api" + concrete)
        except Resolver404:
            pytest.fail(f"documented path /api{path} does not resolve")
        assert match.url_name != "not-found", f"documented path /api{path} is no endpoint"


@pytest.mark.django_db
def test_metric_names_in_docs_are_served(client, settings):
    settings.DISTSCHED = {"METRICS_PUBLIC": True}
    served = client.get("/metrics").content.decode()
    schema_names = {  # the models' index and constraint names (tables of index sizes name them)
        named.name for model in apps.get_models() for named in (*model._meta.indexes, *model._meta.constraints)
    }
    for name, text in TEXT.items():
        for metric in set(re.findall(r"\b(distsched_[a-z_]+)", text)) - schema_names:
            if metric.startswith(
                (
                    "distsched_app",
                    "distsched_demo",
                    "distsched_ci",
                    "distsched_bench",
                    "distsched_scale",  # the 10M-run benchmark database
                    "distsched_run_waiting",
                    "distsched_run_leased",
                    "distsched_sched_due",
                    "distsched_run_unique_slot",
                    "distsched_run_state",
                    "distsched_run_sched",
                    "distsched_event",
                    "distsched_run_finished",
                    "distsched_dashboard",
                    "distsched_run_idem",
                    "distsched_wakeup",  # the NOTIFY channel
                    "distsched_listen",  # the listener's application_name
                    "distsched_docs",  # docs/_ext/distsched_docs.py
                    "distsched_clock",  # the pytest fixtures (distsched_app.pytest_plugin)
                    "distsched_drain",
                    "distsched_enqueue_run",  # the PostgreSQL enqueue function (migration 0025)
                    "distsched_enqueue_before",  # bench/README's before/after scratch databases
                    "distsched_enqueue_after",
                )
            ):
                continue  # app labels, databases, index and URL names
            base = re.sub(r"_(bucket|gcount|gsum)$", "", metric)
            assert base in served, f"{name} documents metric {metric}, which /metrics does not serve"


def variables_read_by_the_project_settings() -> set[str]:
    return set(re.findall(r'\benv\.\w+\("([A-Z_]+)"', (ROOT / "scheduler_project" / "settings.py").read_text()))


def test_deployment_table_lists_exactly_the_variables_the_settings_read():
    table = set(re.findall(r"^\| `([A-Z_]+)` \|", TEXT["docs/deployment.md"], re.MULTILINE))
    read = variables_read_by_the_project_settings()
    assert "DJANGO_SECRET_KEY" in read and "DATABASE_URL" in read
    assert table == read, table ^ read


def test_django_variables_named_anywhere_are_read_by_the_settings():
    read = variables_read_by_the_project_settings() | {"DJANGO_SETTINGS_MODULE"}  # Django's own
    for name, text in TEXT.items():
        for variable in set(re.findall(r"\b(DJANGO_[A-Z_]+)", text)):
            assert variable in read, f"{name} mentions {variable}, which scheduler_project/settings.py does not read"
