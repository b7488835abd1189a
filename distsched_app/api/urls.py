"""REST API routes, mounted under ``/api/`` by ``distsched_app.urls``.

Every route answers with and without a trailing slash (``/?$``), so neither
form redirects (a redirect would turn a POST into a GET in many clients). Any
other path under ``/api/`` is the API's JSON 404, not Django's HTML page.
"""

from django.urls import re_path
from rest_framework.routers import SimpleRouter

from .bulk import BulkActionViewSet
from .errors import not_found
from .limits import LimitViewSet
from .queues import QueueViewSet
from .views import DocsView, RunViewSet, ScheduleViewSet, SchemaView, StatsView, WorkerViewSet
from .workflows import WorkflowViewSet

app_name = "distsched_api"

router = SimpleRouter()
router.trailing_slash = "/?"  # the constructor only offers "/" or ""; routes are regexes, so "/?" works
router.register("schedules", ScheduleViewSet, basename="schedule")
router.register("runs/bulk", BulkActionViewSet, basename="bulk-action")  # before "runs": its {id} would take "bulk"
router.register("runs", RunViewSet, basename="run")
router.register("workers", WorkerViewSet, basename="worker")
router.register("queues", QueueViewSet, basename="queue")
router.register("limits", LimitViewSet, basename="limit")
router.register("workflows", WorkflowViewSet, basename="workflow")

urlpatterns = [
    *router.urls,
    re_path(r"^stats/?$", StatsView.as_view(), name="stats"),
    re_path(r"^schema/?$", SchemaView.as_view(), name="schema"),
    re_path(r"^docs/?$", DocsView.as_view(url_name="distsched_api:schema"), name="docs"),
    re_path(r"", not_found, name="not-found"),  # last: whatever the routes above did not match
]
