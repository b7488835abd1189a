"""``manage.py distsched workflow list|show|cancel``: tables, --json, errors."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError

from distsched_app import workflows
from distsched_app.models import Run, Workflow

pytestmark = pytest.mark.django_db


@pytest.fixture
def flow(clock):
    return workflows.enqueue(
        {"name": "onboard", "nodes": [{"id": "fetch", "task": "tests.noop"},
                                      {"id": "bill", "task": "tests.noop", "after": ["fetch"]}]},
        clock=clock,
    )  # fmt: skip


def test_list_filters_by_state_and_name(cli, flow):
    rows = json.loads(cli("workflow", "list", "--json", "--state", "running"))
    assert [(r["id"], r["name"], r["state"]) for r in rows] == [(flow.id, "onboard", "running")]
    assert json.loads(cli("workflow", "list", "--json", "--name", "other")) == []
    text = cli("workflow", "list")
    assert "onboard" in text and "running" in text


def test_show_lists_nodes_with_runs_states_and_upstreams(cli, flow):
    document = json.loads(cli("workflow", "show", str(flow.id), "--json"))
    assert [(n["id"], n["run"], n["state"], n["after"]) for n in document["nodes"]] == [
        ("fetch", flow.runs["fetch"], "pending", []),
        ("bill", flow.runs["bill"], "blocked", ["fetch"]),
    ]
    text = cli("workflow", "show", str(flow.id))
    assert "NODE" in text and "bill" in text and "fetch" in text


def test_cancel_cancels_every_unfinished_node(cli, flow):
    document = json.loads(cli("workflow", "cancel", str(flow.id), "--reason", "wrong account", "--json"))
    assert document["state"] == "cancelled"
    assert set(Run.objects.values_list("state", flat=True)) == {"cancelled"}
    with pytest.raises(CommandError, match="only a running one"):
        cli("workflow", "cancel", str(flow.id))


def test_an_unknown_workflow_is_a_one_line_error(cli):
    with pytest.raises(CommandError, match="no workflow with id 999"):
        cli("workflow", "show", "999")
    assert not Workflow.objects.exists()
