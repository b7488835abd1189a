"""The example app behaves as its docstrings promise, through the public API only."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from distsched_app.models import Run, RunState, Schedule
from examples.demo import receiver
from examples.demo.models import Invoice, WebhookReceipt

pytestmark = pytest.mark.django_db


def test_load_demo_schedules_is_idempotent():
    call_command("load_demo_schedules", stdout=StringIO())
    out = StringIO()
    call_command("load_demo_schedules", stdout=out)
    assert "already exists" in out.getvalue()
    assert set(Schedule.objects.values_list("name", flat=True)) == {
        "daily-summary",
        "billing-sync",
        "webhook-delivery",
        "long-report",
        "heartbeat",
        "convert-amount",
    }
    assert Schedule.objects.get(name="daily-summary").timezone == "Europe/Paris"


def test_billing_sync_re_execution_does_not_charge_twice(scheduler, clock):
    scheduler.create_schedule(
        name="billing",
        task_name="demo.billing_sync",
        interval_seconds=3600,
        kwargs={"account_id": 1, "amount_cents": 500},
    )
    scheduler.tick()
    worker = scheduler.worker(worker_id="w1", heartbeat_seconds=3600)
    assert worker.run_once().state == RunState.SUCCEEDED
    # The same slot executed again (as after a crash before the success was recorded).
    run = Run.objects.get()
    Run.objects.filter(pk=run.pk).update(state=RunState.PENDING)
    assert scheduler.worker(worker_id="w2", heartbeat_seconds=3600).run_once().state == RunState.SUCCEEDED
    assert Invoice.objects.count() == 1
    assert Invoice.objects.get().idempotency_key == run.idempotency_key


def test_webhook_retries_with_backoff_then_delivers_with_fencing_token(scheduler, clock):
    scheduler.create_schedule(
        name="hook",
        task_name="demo.deliver_webhook",
        interval_seconds=3600,
        max_attempts=5,
        retry_base_seconds=5,
        kwargs={"endpoint": "x", "payload": {"n": 1}, "failures": 2},
    )
    scheduler.tick()
    worker = scheduler.worker(worker_id="w", heartbeat_seconds=3600)
    assert worker.run_once().state == RunState.RETRYING
    clock.advance(seconds=5)
    assert worker.run_once().state == RunState.RETRYING
    clock.advance(seconds=10)
    assert worker.run_once().state == RunState.SUCCEEDED
    run = Run.objects.get()
    receipt = WebhookReceipt.objects.get()
    assert (receipt.run_id, receipt.attempt) == (run.pk, 3)
    # A zombie's late delivery with an older token is refused by the receiver.
    with pytest.raises(receiver.StaleFencingToken):
        receiver.receive(delivery_key=run.idempotency_key, fencing_token=f"{run.pk}:2", payload={})


def test_long_report_stops_when_cancelled(scheduler):
    scheduler.create_schedule(
        name="report", task_name="demo.long_report", interval_seconds=3600, kwargs={"steps": 3, "step_seconds": 0}
    )
    [run] = scheduler.tick()
    worker = scheduler.worker(worker_id="w", heartbeat_seconds=3600)
    claimed = worker.loop.claim(1)
    scheduler.cancel_run(run.pk)  # requested while it runs
    execution = worker.execute(claimed[0])
    assert execution.state == RunState.CANCELLED


def test_daily_summary_and_heartbeat_succeed(scheduler):
    scheduler.create_schedule(name="sum", task_name="demo.daily_summary", interval_seconds=60, kwargs={"account_id": 7})
    scheduler.create_schedule(name="hb", task_name="demo.heartbeat", interval_seconds=60)
    scheduler.tick()
    worker = scheduler.worker(worker_id="w", heartbeat_seconds=3600)
    assert worker.run(burst=True, install_signals=False) == 2
    assert Run.objects.filter(state=RunState.SUCCEEDED).count() == 2
