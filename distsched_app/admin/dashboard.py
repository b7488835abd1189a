"""The admin dashboard: run counts by state, worker liveness, overdue schedules, saturated limits,
a 24-hour chart and the last hour's per-task timing (``services.queue_stats.task_timings``).

Served by ``RunAdmin.get_urls`` under ``/admin/distsched_app/run/dashboard/``
(URL name ``admin:distsched_dashboard``), so it needs a staff login like any
admin page, and the view permission on runs. Every figure comes from a
read-only service (``services.stats``); the chart is
inline SVG drawn server-side from ``chart.build_chart``.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse

from ..conf import conf
from ..models import RunState
from ..services import limit_summary, queue_stats
from ..services import stats as stats_service
from .chart import build_chart
from .display import duration
from .support import request_now


def view(model_admin: Any, request: HttpRequest) -> TemplateResponse:
    """The dashboard page, for ``RunAdmin.dashboard_view``: the run permission checked, the clock read once."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    now = request_now(request)
    figures = stats_service.stats(now=now)
    runs_url = reverse("admin:distsched_app_run_changelist")
    workers_url = reverse("admin:distsched_app_worker_changelist")
    states = [
        {"state": state, "count": figures.runs_by_state.get(state, 0), "url": f"{runs_url}?state={state}"}
        for state in RunState.values
    ]
    hours = stats_service.outcomes_per_hour(now=now)
    timings = [
        {"timing": t, "p50": duration(t.duration.p50), "p95": duration(t.duration.p95), "max": duration(t.duration.max)}
        for t in queue_stats.task_timings(now=now)
    ]
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Scheduler dashboard",
        "opts": model_admin.opts,
        "now": now,
        "stats": figures,
        "states": states,
        "runs_total": sum(s["count"] for s in states),
        "runs_url": runs_url,
        "workers_url": workers_url,
        "schedules_url": reverse("admin:distsched_app_schedule_changelist"),
        "overdue": stats_service.overdue_schedules(now=now),
        "limits_declared": limit_summary.any_declared(),
        "saturated_limits": [
            {"status": s, "capacity": limit_summary.capacity(s)} for s in limit_summary.saturated(now)
        ],
        "grace_seconds": conf.MISFIRE_GRACE_SECONDS,
        "stale_after_seconds": conf.STALE_AFTER_SECONDS,
        "chart": build_chart(hours),
        "task_timings": timings,
        "timing_minutes": int(queue_stats.WINDOW.total_seconds() // 60),
        "queues_url": reverse("admin:distsched_queues"),
        "mean_duration": duration(figures.mean_duration_seconds),
        "first_hour": hours[0].start,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/distsched_app/dashboard.html", context)
