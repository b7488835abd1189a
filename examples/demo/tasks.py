"""Example tasks, written only against distsched's public API.

Copy from these: each shows one habit of a task that is safe under
at-least-once execution.
"""

from __future__ import annotations

import logging
import time

from distsched_app import RunContext, task

from . import receiver
from .models import Invoice

logger = logging.getLogger("distsched.examples")


@task("demo.daily_summary")
def daily_summary(account_id: int, context: RunContext) -> dict:
    """Cron in a time zone (see load_demo_schedules: 07:30 Europe/Paris).

    Read-only work is naturally idempotent: running it twice is harmless.
    """
    from distsched_app.models import Run

    finished = Run.objects.filter(state="succeeded").count()
    logger.info("daily summary for account %s: %s runs succeeded so far", account_id, finished)
    return {"account_id": account_id, "succeeded_runs": finished, "slot": context.scheduled_for.isoformat()}


@task("demo.billing_sync")
def billing_sync(account_id: int, amount_cents: int, context: RunContext) -> dict:
    """Interval, hourly. An upsert keyed by ``context.idempotency_key``
    (``"<schedule>:<slot>"``, the same for every retry and re-execution of this
    run), so a second execution of the same slot finds the invoice and stops."""
    invoice, created = Invoice.objects.get_or_create(
        idempotency_key=context.idempotency_key,
        defaults={"account_id": account_id, "amount_cents": amount_cents},
    )
    return {"invoice": invoice.pk, "created": created}


@task("demo.deliver_webhook")
def deliver_webhook(endpoint: str, payload: dict, context: RunContext, failures: int = 2) -> dict:
    """Fails transiently ``failures`` times (retried with exponential backoff),
    then delivers. The receiver gets the idempotency key as the delivery key
    and the fencing token, and rejects a token older than one it already took."""
    if context.attempt <= failures:
        raise receiver.TransientReceiverError(f"{endpoint} answered 503 (attempt {context.attempt})")
    receipt = receiver.receive(
        delivery_key=context.idempotency_key, fencing_token=context.fencing_token, payload=payload
    )
    return {"delivered": receipt.delivery_key, "token": context.fencing_token}


@task("demo.long_report")
def long_report(steps: int, context: RunContext, step_seconds: float = 0.5) -> dict:
    """A long task that can be cancelled: it checks ``context.cancel_requested()``
    between steps. ``raise_if_cancelled()`` ends the run ``cancelled``; a task
    is never killed from outside."""
    done = 0
    for _ in range(steps):
        context.raise_if_cancelled()
        time.sleep(step_seconds)
        done += 1
    return {"steps": done}


@task("demo.heartbeat")
def heartbeat(context: RunContext) -> dict:
    """A no-op that says where it ran: useful to watch runs succeed."""
    return {"worker": context.worker_id, "attempt": context.attempt}


# -- django.tasks: the same habits through Django's task framework (backend: distsched) -----------

try:
    from django.tasks import task as framework_task  # Django 6
except ImportError:
    from django_tasks import task as framework_task  # Django 5.2: the backport


@framework_task(queue_name="emails", takes_context=True)
def email_receipt(context, invoice_id: int) -> dict:
    """Enqueued from the admin (Invoices: "Email a receipt") or the demo's view
    (``POST /demo/invoices/<id>/receipt``). A real mail provider would take
    ``context.idempotency_key`` (distsched's extra on the framework's context) as
    its delivery key, so a re-executed run does not send twice."""
    invoice = Invoice.objects.get(pk=invoice_id)
    return {
        "invoice": invoice.pk,
        "to_account": invoice.account_id,
        "delivery_key": context.idempotency_key,
        "attempt": context.attempt,
    }


@framework_task
async def convert_amount(amount_cents: int, rate: float = 0.92) -> int:
    """An async task: awaited on the worker's event loop. Returns JSON (an int)."""
    return round(amount_cents * rate)
