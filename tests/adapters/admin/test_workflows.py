"""Admin: the workflow list, the workflow page (graph as SVG, node table, cancel) and the run page's workflow."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from distsched_app import workflows
from distsched_app.admin.workflow_graph import COLOURS, layout
from distsched_app.models import Run, RunState, Workflow, WorkflowState

pytestmark = pytest.mark.django_db


@pytest.fixture
def flow(clock):
    return workflows.enqueue(
        {"name": "onboard", "nodes": [
            {"id": "fetch", "task": "tests.noop"},
            {"id": "bill", "task": "tests.noop", "after": ["fetch"]},
            {"id": "mail", "task": "tests.noop", "after": ["fetch"]},
            {"id": "report", "task": "tests.noop", "after": ["bill", "mail"]},
        ]},
        clock=clock,
    )  # fmt: skip


def test_layout_puts_a_node_right_of_its_upstreams():
    graph = layout([("a", 1, "succeeded", ()), ("b", 2, "blocked", ("a",)), ("c", 3, "blocked", ("a",)),
                    ("d", 4, "blocked", ("b", "c"))])  # fmt: skip
    x = {b.id: b.x for b in graph.boxes}
    assert x["a"] < x["b"] == x["c"] < x["d"]
    assert len(graph.arrows) == 4
    assert {b.id: b.colour for b in graph.boxes}["a"] == COLOURS["succeeded"]


def test_the_list_shows_workflows_filtered_by_state(staff, flow):
    page = staff.get(reverse("admin:distsched_app_workflow_changelist"), {"state__exact": "running"})
    assert page.status_code == 200
    assert "onboard" in page.content.decode()
    page = staff.get(reverse("admin:distsched_app_workflow_changelist"), {"state__exact": "failed"})
    assert "onboard" not in page.content.decode()


def test_the_page_draws_the_graph_with_coloured_states_and_links_to_runs(staff, flow):
    page = staff.get(reverse("admin:distsched_app_workflow_change", args=[flow.id]))
    html = page.content.decode()
    assert page.status_code == 200
    assert "<svg class='distsched-graph'" in html
    nodes = dict(re.findall(r"data-node='([^']+)' data-state='([^']+)'", html))
    assert nodes == {"fetch": "pending", "bill": "blocked", "mail": "blocked", "report": "blocked"}
    for run_id in flow.runs.values():
        assert reverse("admin:distsched_app_run_change", args=[run_id]) in html
    assert COLOURS["pending"] in html and COLOURS["blocked"] in html


def test_the_run_page_shows_its_workflow(staff, flow):
    page = staff.get(reverse("admin:distsched_app_run_change", args=[flow.runs["bill"]]))
    html = page.content.decode()
    assert reverse("admin:distsched_app_workflow_change", args=[flow.id]) in html
    assert "node bill" in html


def test_the_cancel_button_cancels_every_unfinished_node(staff, flow):
    response = staff.post(reverse("admin:distsched_app_workflow_cancel", args=[flow.id]))
    assert response.status_code == 302
    assert Workflow.objects.get(pk=flow.id).state == WorkflowState.CANCELLED
    assert set(Run.objects.filter(workflow_id=flow.id).values_list("state", flat=True)) == {RunState.CANCELLED}
