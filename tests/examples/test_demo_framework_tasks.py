"""The demo's django.tasks examples: enqueued from the admin and from a view, scheduled by
load_demo_schedules, and run by ``distsched_app.testing.drain``."""

from __future__ import annotations

from io import StringIO
from types import SimpleNamespace

import pytest
from django.core.management import call_command

from distsched_app.models import Run, RunState
from distsched_app.testing import drain
from examples.demo import tasks as demo_tasks
from examples.demo.models import Invoice
from examples.demo.tasks import convert_amount, email_receipt

pytestmark = pytest.mark.django_db


@pytest.fixture
def invoice():
    return Invoice.objects.create(idempotency_key="demo:1", account_id=42, amount_cents=1999)


def test_the_admin_action_enqueues_a_receipt_that_a_worker_sends(admin_client, invoice, clock):
    response = admin_client.post(
        "/admin/distsched_demo/invoice/",
        {"action": "send_receipts", "_selected_action": [invoice.pk]},
        follow=True,
    )
    assert response.status_code == 200
    run = Run.objects.get()
    assert [str(m) for m in response.context["messages"]] == [f"enqueued 1 receipt(s): run(s) {run.pk}"]
    assert (run.task_name, run.queue) == ("examples.demo.tasks.email_receipt", "emails")
    assert drain().succeeded == 1
    result = email_receipt.get_result(str(run.pk))
    assert result.return_value == {
        "invoice": invoice.pk,
        "to_account": 42,
        "delivery_key": run.idempotency_key,
        "attempt": 1,
    }


def test_the_view_enqueues_a_receipt(admin_client, invoice, clock):
    response = admin_client.post(f"/demo/invoices/{invoice.pk}/receipt")
    assert response.status_code == 202
    body = response.json()
    assert body["status"].endswith("READY")
    assert drain().succeeded == 1
    assert email_receipt.get_result(body["id"]).status.name == "SUCCESSFUL"


def test_the_view_refuses_anonymous_and_get(client, admin_client, invoice):
    assert client.post(f"/demo/invoices/{invoice.pk}/receipt").status_code == 302  # to the admin login
    assert admin_client.get(f"/demo/invoices/{invoice.pk}/receipt").status_code == 405
    assert admin_client.post("/demo/invoices/999999/receipt").status_code == 404
    assert not Run.objects.exists()


def test_the_async_framework_task_runs_from_its_demo_schedule(clock, monkeypatch):
    # Every demo schedule comes due; the hourly long report would sleep 40 x 0.5 s in real time.
    monkeypatch.setattr(demo_tasks, "time", SimpleNamespace(sleep=lambda seconds: None))
    call_command("load_demo_schedules", stdout=StringIO())
    done = drain(clock=clock)
    run = Run.objects.get(task_name="examples.demo.tasks.convert_amount")
    assert run.state == RunState.SUCCEEDED and run.result == 1839  # round(1999 * 0.92)
    assert done.created == Run.objects.count()


def test_convert_amount_enqueued_directly(clock):
    result = convert_amount.enqueue(100, rate=1.5)
    drain()
    result.refresh()
    assert result.return_value == 150


def test_every_task_the_readme_names_is_one_the_demo_has():
    import re
    from pathlib import Path

    from distsched_app.registry import registry

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    named = set(re.findall(r"--task ([\w.:-]+)", readme)) | set(re.findall(r"\btask=([\w.:-]+)", readme))
    named |= set(re.findall(r"\b(demo\.[a-z_]+|examples\.demo\.tasks\.[a-z_]+)\b", readme))
    assert named, "the README names no task: this test would check nothing"
    demo = {name for name in registry.names() if name.startswith(("demo.", "examples.demo."))}
    assert named <= demo, f"the README names tasks the demo lacks: {sorted(named - demo)}"
