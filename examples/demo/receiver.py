"""A stand-in for the system a webhook is delivered to.

Real receivers (a payment provider, another service) accept an
``Idempotency-Key`` and should reject a fencing token older than the newest
one they have seen. This module plays that part against a local table.
"""

from __future__ import annotations

from django.db import transaction

from .models import WebhookReceipt


class StaleFencingToken(Exception):
    """A delivery from an attempt older than one already accepted."""


class TransientReceiverError(Exception):
    """The receiver is briefly unavailable: the sender should retry later."""


def receive(*, delivery_key: str, fencing_token: str, payload: dict) -> WebhookReceipt:
    """Accept a delivery unless a newer attempt of the same run already delivered."""
    run_id, attempt = (int(part) for part in fencing_token.split(":"))
    with transaction.atomic():
        receipt = WebhookReceipt.objects.select_for_update().filter(delivery_key=delivery_key).first()
        if receipt is not None and (receipt.run_id, receipt.attempt) > (run_id, attempt):
            raise StaleFencingToken(f"token {fencing_token} is older than {receipt.run_id}:{receipt.attempt}")
        if receipt is None:
            return WebhookReceipt.objects.create(
                delivery_key=delivery_key, run_id=run_id, attempt=attempt, payload=payload
            )
        receipt.run_id, receipt.attempt, receipt.payload = run_id, attempt, payload
        receipt.save()
        return receipt
