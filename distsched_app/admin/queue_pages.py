"""The queues page: every queue's depth, oldest waiting run, start lag, throughput, workers, limits
and pause; and one page per queue with its pause/resume form and history.

Served by ``QueuePauseAdmin.get_urls`` under ``/admin/distsched_app/queuepause/queues/`` (URL
names ``admin:distsched_queues`` and ``admin:distsched_queue``). Reading needs the view
permission on queue pauses (as ``GET /api/queues``); pausing and resuming, the change permission.
Every figure comes from ``services.queue_stats``; pause and resume call ``services.queues``.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.admin.utils import quote
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import urlencode

from ..errors import DistschedError, NotFound
from ..models import AuditSource
from ..services import queue_stats
from ..services import queues as queue_service
from .display import duration, ts
from .support import operator, request_now

HISTORY_SHOWN = 20


def queue_url(name: str) -> str:
    return reverse("admin:distsched_queue", args=[quote(name)])


def _row(found: queue_stats.QueueStats, runs_url: str) -> dict[str, Any]:
    lag = found.start_lag
    return {
        "stats": found,
        "url": queue_url(found.queue),
        "runs_url": f"{runs_url}?{urlencode({'queue': found.queue})}",
        "states": [
            {"state": state, "count": n, "url": f"{runs_url}?{urlencode({'queue': found.queue, 'state': state})}"}
            for state, n in found.runs.items()
        ],
        "oldest_age": duration(found.oldest_waiting_seconds),
        "oldest_at": ts(found.oldest_waiting_at),
        "lag_p50": duration(lag.p50),
        "lag_p95": duration(lag.p95),
        "throughput": f"{found.throughput_per_minute:.1f}",
    }


def _context(model_admin: Any, request: HttpRequest, title: str) -> dict[str, Any]:
    return {
        **model_admin.admin_site.each_context(request),
        "title": title,
        "opts": model_admin.opts,
        "now": request_now(request),
        "window_minutes": int(queue_stats.WINDOW.total_seconds() // 60),
        "sample_limit": f"{queue_stats.SAMPLE_LIMIT:,}",
        "list_url": reverse("admin:distsched_queues"),
        "pauses_url": reverse("admin:distsched_app_queuepause_changelist"),
        "dashboard_url": reverse("admin:distsched_dashboard"),
        "can_operate": model_admin.has_operate_permission(request),
    }


def list_view(model_admin: Any, request: HttpRequest) -> TemplateResponse:
    if not model_admin.has_view_or_change_permission(request):
        raise PermissionDenied
    runs_url = reverse("admin:distsched_app_run_changelist")
    found = queue_stats.queue_stats(now=request_now(request))
    context = {**_context(model_admin, request, "Queues"), "queues": [_row(q, runs_url) for q in found]}
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/distsched_app/queues.html", context)


def detail_view(model_admin: Any, request: HttpRequest, name: str) -> TemplateResponse:
    if not model_admin.has_view_or_change_permission(request):
        raise PermissionDenied
    try:
        found = queue_stats.queue_detail(name, now=request_now(request))
    except (NotFound, DistschedError) as exc:
        raise Http404(str(exc)) from None
    runs_url = reverse("admin:distsched_app_run_changelist")
    context = {
        **_context(model_admin, request, f"Queue {found.queue}"),
        "queue": _row(found, runs_url),
        "history": queue_service.queue_events(found.queue, limit=HISTORY_SHOWN),
        "history_shown": HISTORY_SHOWN,
        "max_reason": queue_service.MAX_REASON,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/distsched_app/queue.html", context)


def change_view(model_admin: Any, request: HttpRequest, name: str, *, pause: bool) -> HttpResponse:
    """The queue page's form (POST only): pause with a reason, or resume; then back to the page."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    if not model_admin.has_operate_permission(request):
        raise PermissionDenied
    now, by = request_now(request), operator(request)
    try:
        if pause:
            done = queue_service.pause_queue(
                name, now=now, by=by, reason=request.POST.get("reason", ""), source=AuditSource.ADMIN
            )
            text = f"Paused queue {done.queue}." if done.changed else f"Queue {done.queue} was already paused."
        else:
            done = queue_service.resume_queue(name, now=now, by=by, source=AuditSource.ADMIN)
            text = f"Resumed queue {done.queue}." if done.changed else f"Queue {done.queue} was not paused."
    except DistschedError as exc:
        model_admin.message_user(request, f"Queue {name}: {exc}", messages.ERROR)
        return HttpResponseRedirect(reverse("admin:distsched_queues"))
    model_admin.message_user(request, text, messages.SUCCESS if done.changed else messages.WARNING)
    return HttpResponseRedirect(queue_url(done.queue))
