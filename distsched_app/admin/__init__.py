"""The Django admin of distsched: schedules, runs, workers, run events and a dashboard.

A thin adapter (DESIGN section 7): every action and button calls one service
function per selected object and reports the result or the typed error with
``message_user``. Run state is never hand-edited: runs, workers and events
are read-only pages, changed only through the service-backed actions.
The clock is read once per request (``support.request_now``).

Django's ``autodiscover_modules("admin")`` imports this package; importing the
ModelAdmins below registers them (each module uses ``@admin.register``).

    schedules  ScheduleAdmin               forms      the schedule form
    runs       RunAdmin                    events     RunEventAdmin and the run page's history
    workers    WorkerAdmin                 lists      paginator and list filters
    queues     QueuePauseAdmin (paused queues: pause, resume), QueueEventAdmin (their history)
    limits     LimitAdmin (declared limits; a limit's override, reset and history)
    workflows  WorkflowAdmin (a workflow's graph as SVG, its nodes; cancel)
    audit      AuditEntryAdmin (schedule versions and the operators' action log, read-only)
    bulk       BulkActionAdmin (bulk actions on runs: progress, read-only; the run list's "select all N")
    dashboard  the dashboard view          chart      the dashboard's SVG chart geometry
    support    clock, applying, reporting  mixins     stylesheet, change-page buttons
    display    formatting
"""

from django.contrib import admin

from .audit import AuditEntryAdmin
from .bulk import BulkActionAdmin
from .events import RunEventAdmin
from .limits import LimitAdmin
from .queues import QueueEventAdmin, QueuePauseAdmin
from .runs import RunAdmin
from .schedules import ScheduleAdmin
from .workers import WorkerAdmin
from .workflows import WorkflowAdmin

__all__ = [
    "AuditEntryAdmin",
    "BulkActionAdmin",
    "LimitAdmin",
    "QueueEventAdmin",
    "QueuePauseAdmin",
    "RunAdmin",
    "RunEventAdmin",
    "ScheduleAdmin",
    "WorkerAdmin",
    "WorkflowAdmin",
]

# The admin index links to the dashboard unless the project has its own index template.
if admin.site.index_template is None:
    admin.site.index_template = "admin/distsched_app/index.html"
