from django.urls import path

from . import views

urlpatterns = [path("invoices/<int:invoice_id>/receipt", views.send_receipt, name="demo-send-receipt")]
