"""The task framework: Django's own on Django 6, the django-tasks backport on Django 5.2."""

try:
    from django.tasks import task, task_backends
except ImportError:  # Django 5.2: django.tasks does not exist
    from django_tasks import task, task_backends

__all__ = ["task", "task_backends"]
