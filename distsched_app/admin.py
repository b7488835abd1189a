"""The Django admin of distsched: schedules, runs, workers, run events and a dashboard.

A thin adapter (DESIGN section 7): every action and button calls one service
function per selected object and reports the result or the typed error with
``message_user``. Run state is never hand-edited: runs, workers and events
are read-only pages, changed only through the service-backed actions.
The clock is read once per request (``admin_support.request_now``).

    admin_schedules  ScheduleAdmin          admin_runs     RunAdmin, RunEventAdmin
    admin_workers    WorkerAdmin            admin_views    the dashboard
    admin_forms      the schedule form      admin_lists    paginator and list filters
    admin_support    clock, reporting       admin_display  formatting
"""

from django.contrib import admin

from .admin_runs import RunAdmin, RunEventAdmin
from .admin_schedules import ScheduleAdmin
from .admin_workers import WorkerAdmin

__all__ = ["RunAdmin", "RunEventAdmin", "ScheduleAdmin", "WorkerAdmin"]

# The admin index links to the dashboard unless the project has its own index template.
if admin.site.index_template is None:
    admin.site.index_template = "admin/distsched_app/index.html"
