"""URL configuration: the admin, and distsched's API and metrics."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("distsched_app.urls")),
]
