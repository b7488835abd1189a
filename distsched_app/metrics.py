"""Prometheus metrics, computed from the database at scrape time (filled in by the metrics module)."""

from django.http import HttpRequest, HttpResponse


def metrics_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("", content_type="text/plain; version=0.0.4")
