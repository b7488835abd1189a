"""URL configuration: the admin, distsched's API and metrics, and the demo's view."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("distsched_app.urls")),
    path("demo/", include("examples.demo.urls")),
]
