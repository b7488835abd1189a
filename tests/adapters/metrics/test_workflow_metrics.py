"""``GET /metrics``: ``distsched_workflows{state}``, every state a series."""

from __future__ import annotations

import pytest

from distsched_app import workflows
from tests.adapters.metrics.test_metrics import parse, sample

pytestmark = pytest.mark.django_db


def test_workflows_by_state(client, settings, clock):
    settings.DISTSCHED = {"METRICS_PUBLIC": True}
    for name in ("a", "b"):
        workflows.enqueue({"name": name, "nodes": [{"id": "x", "task": "tests.noop"}]}, clock=clock)
    workflows.cancel(workflows.enqueue({"name": "c", "nodes": [{"id": "x", "task": "tests.noop"}]}, clock=clock).id)
    types, values = parse(client.get("/metrics"))
    assert types["distsched_workflows"] == "gauge"
    assert sample(values, "distsched_workflows", state="running") == 2
    assert sample(values, "distsched_workflows", state="cancelled") == 1
    assert sample(values, "distsched_workflows", state="succeeded") == 0
    assert sample(values, "distsched_workflows", state="failed") == 0
