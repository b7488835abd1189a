"""Tables of the example app: what idempotent tasks write, and a webhook receiver's memory."""

from django.db import models


class Invoice(models.Model):
    """Written by the hourly billing sync. The unique idempotency key makes a
    re-executed run (after a crash or a lost lease) find its row instead of
    charging twice."""

    idempotency_key = models.CharField(max_length=255, unique=True)
    account_id = models.PositiveIntegerField()
    amount_cents = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"invoice {self.idempotency_key}"


class WebhookReceipt(models.Model):
    """The receiving side of the webhook example: it remembers the newest
    fencing token per delivery and rejects older ones, so a zombie worker's
    late retry cannot overwrite a newer attempt's delivery."""

    delivery_key = models.CharField(max_length=255, unique=True)
    run_id = models.BigIntegerField()
    attempt = models.PositiveIntegerField()
    payload = models.JSONField(default=dict)
    received_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"receipt {self.delivery_key} ({self.run_id}:{self.attempt})"
