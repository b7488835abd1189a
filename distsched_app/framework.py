"""Django's task framework, wherever it comes from: ``django.tasks`` (Django 6) or the
``django-tasks`` backport (Django 5.2).

Both offer the same classes under the same module names (``base``, ``signals``,
``exceptions``, ``backends.base``), except the exceptions that the backport 0.12
still calls ``InvalidTaskError``/``InvalidTaskBackendError``; the rest of
distsched imports the framework from here only. ``AVAILABLE`` is False when
neither is installed: the scheduler then works as before, without the backend.
The modules are looked up at import time, so neither is a hard dependency.
"""

from __future__ import annotations

from importlib import import_module
from importlib.util import find_spec
from typing import Any


def _root() -> str:
    if find_spec("django.tasks") is not None:  # Django 6
        return "django.tasks"
    if find_spec("django_tasks") is not None:  # the backport, on Django 5.2
        return "django_tasks"
    return ""


SOURCE = _root()
AVAILABLE = bool(SOURCE)

BaseTaskBackend: Any = object
Task: Any = None
TaskContext: Any = None
TaskError: Any = None
TaskResult: Any = None
TaskResultStatus: Any = None
InvalidTask: Any = None
TaskResultDoesNotExist: Any = None
task_backends: Any = None
default_task_backend: Any = None
task_enqueued: Any = None
task_started: Any = None
task_finished: Any = None
normalize_json: Any = None
TASK_MIN_PRIORITY, TASK_MAX_PRIORITY = -100, 100

if AVAILABLE:
    _base = import_module(f"{SOURCE}.base")
    _signals = import_module(f"{SOURCE}.signals")
    _exceptions = import_module(f"{SOURCE}.exceptions")
    _package = import_module(SOURCE)
    BaseTaskBackend = import_module(f"{SOURCE}.backends.base").BaseTaskBackend
    Task, TaskContext, TaskError = _base.Task, _base.TaskContext, _base.TaskError
    TaskResult, TaskResultStatus = _base.TaskResult, _base.TaskResultStatus
    TASK_MIN_PRIORITY, TASK_MAX_PRIORITY = _base.TASK_MIN_PRIORITY, _base.TASK_MAX_PRIORITY
    TaskResultDoesNotExist = _exceptions.TaskResultDoesNotExist
    InvalidTask = getattr(_exceptions, "InvalidTask", None) or _exceptions.InvalidTaskError
    task_backends, default_task_backend = _package.task_backends, _package.default_task_backend
    task_enqueued, task_started, task_finished = _signals.task_enqueued, _signals.task_started, _signals.task_finished
    normalize_json = (
        import_module("django.utils.json").normalize_json
        if SOURCE == "django.tasks"
        else import_module("django_tasks.utils").normalize_json
    )
