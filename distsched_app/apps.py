"""App configuration: discover every installed app's ``tasks`` module."""

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class DistschedConfig(AppConfig):
    name = "distsched_app"
    label = "distsched_app"
    verbose_name = "distsched"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Import side effects only: @task registers functions. No queries, no threads.
        from . import checks  # noqa: F401

        autodiscover_modules("tasks")
