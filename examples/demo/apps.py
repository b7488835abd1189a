from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "examples.demo"
    label = "distsched_demo"
    verbose_name = "distsched demo"
    default_auto_field = "django.db.models.BigAutoField"
