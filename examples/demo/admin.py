"""The demo's invoices in the admin, with an action that enqueues a django.tasks task."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages

from .models import Invoice
from .tasks import email_receipt


@admin.register(Invoice)
class InvoiceAdmin(admin.ModelAdmin):
    list_display = ("idempotency_key", "account_id", "amount_cents", "created_at")
    actions = ["send_receipts"]

    @admin.action(description="Email a receipt (django.tasks)")
    def send_receipts(self, request: Any, queryset: Any) -> None:
        # Enqueued in the request's transaction: a rollback enqueues nothing.
        ids = [email_receipt.enqueue(invoice.pk).id for invoice in queryset]
        self.message_user(request, f"enqueued {len(ids)} receipt(s): run(s) {', '.join(ids)}", messages.SUCCESS)
