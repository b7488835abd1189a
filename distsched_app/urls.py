"""distsched's URLs. Include them at the site root::

    path("", include("distsched_app.urls"))

which serves the REST API under ``/api/`` and Prometheus metrics at ``/metrics``.
"""

from django.urls import include, path

from .metrics import metrics_view

urlpatterns = [
    path("api/", include("distsched_app.api.urls")),
    path("metrics", metrics_view, name="distsched-metrics"),
    path("metrics/", metrics_view),
]
