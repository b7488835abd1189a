"""A view that enqueues a django.tasks task, as application code does."""

from __future__ import annotations

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.http import require_POST

from .models import Invoice
from .tasks import email_receipt


@require_POST
@staff_member_required
def send_receipt(request: HttpRequest, invoice_id: int) -> JsonResponse:
    """``POST /demo/invoices/<id>/receipt``: enqueue the receipt; 202 with the result's id and status."""
    invoice = get_object_or_404(Invoice, pk=invoice_id)
    result = email_receipt.enqueue(invoice.pk)
    return JsonResponse({"id": result.id, "status": str(result.status)}, status=202)
