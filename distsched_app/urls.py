"""distsched's URLs: include them at the site root (``path("", include("distsched_app.urls"))``)."""

from django.urls import path  # noqa: F401

urlpatterns: list = []
