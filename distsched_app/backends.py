"""distsched as a backend of Django's task framework (``django.tasks``; the ``django-tasks``
backport on Django 5.2).

    TASKS = {"default": {"BACKEND": "distsched_app.backends.DistschedBackend",
                         "QUEUES": ["default", "emails"],
                         "OPTIONS": {"MAX_ATTEMPTS": 5, "RETRY_BASE_SECONDS": 10,
                                     "RETRY_MAX_SECONDS": 3600, "RETRY_JITTER": 0.1}}}

A thin adapter: ``enqueue`` validates the task as the framework does, then
writes a run through ``services.enqueue`` in the caller's transaction (so a
rollback enqueues nothing and no worker sees the run before the commit), and
answers with the framework's ``TaskResult``; ``get_result`` reads the run and its
history. Workers (``manage.py runworker``) execute enqueued runs like scheduled
ones: leases, fencing, retries with backoff, dead runs, history.

Every task this backend validates (at ``@task`` decoration, at ``using()``, at
enqueue) is registered under its module path, so the workers know exactly the
functions declared with ``@task`` in installed apps' ``tasks`` modules: a run
naming anything else fails its attempt, and nothing is ever imported by name.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from .backoff import RetryPolicy
from .clock import current_clock
from .errors import DistschedError, ValidationError
from .framework import BaseTaskBackend, InvalidTask, TaskResultDoesNotExist, task_enqueued
from .registry import registry
from .task_import import import_framework_task

if TYPE_CHECKING:
    from .models import Run

# Nothing here imports distsched's models at import time (they are imported where used): the
# backend must load, and its check() say what is wrong, when distsched_app is not installed.
NOT_INSTALLED = (
    "TASKS names distsched_app.backends.DistschedBackend, but 'distsched_app' is not in INSTALLED_APPS: "
    "add it (its models hold the runs), then run migrate"
)


def _installed() -> bool:
    return not apps.apps_ready or apps.is_installed("distsched_app")


OPTION_NAMES = {
    "MAX_ATTEMPTS": "max_attempts",
    "RETRY_BASE_SECONDS": "retry_base_seconds",
    "RETRY_MAX_SECONDS": "retry_max_seconds",
    "RETRY_JITTER": "retry_jitter",
}


class DistschedBackend(BaseTaskBackend):
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self._policy_error: str | None = None
        self.policy: RetryPolicy | None = None
        if not _installed():
            return  # check() reports it; enqueue refuses
        try:
            self.policy = self._policy()
        except DistschedError as exc:
            self.policy, self._policy_error = None, str(exc)  # reported by check(); enqueue refuses

    def _policy(self) -> RetryPolicy:
        from .services import enqueue as enqueue_service

        unknown = set(self.options) - set(OPTION_NAMES)
        if unknown:
            raise DistschedError(f"unknown OPTIONS: {', '.join(sorted(unknown))} (known: {', '.join(OPTION_NAMES)})")
        return enqueue_service.validate_policy({OPTION_NAMES[k]: v for k, v in self.options.items()})

    def validate_task(self, task: Any) -> None:
        super().validate_task(task)
        if not _installed():
            return  # a @task still imports; check() and enqueue say what is wrong
        from .services.validation import QUEUE_RE

        if not QUEUE_RE.fullmatch(task.queue_name):
            raise InvalidTask(f"Queue '{task.queue_name}' is not a valid distsched queue name.")
        entry = registry.find(task.module_path)
        if entry is None or entry.func is not task.func:
            registry.register_framework_task(task)

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        return self._enqueue(task, args, kwargs, unique_key="")

    def _enqueue(self, task: Any, args: Any, kwargs: Any, *, unique_key: str) -> Any:
        if not _installed():
            raise ImproperlyConfigured(NOT_INSTALLED)
        from . import task_results
        from .services import enqueue as enqueue_service
        from .services.validation import framework_payload, validate_task_queue

        self.validate_task(task)
        if self.policy is None:
            raise InvalidTask(f"TASKS[{self.alias!r}] is misconfigured: {self._policy_error}")
        # The task's options (DISTSCHED["TASK_OPTIONS"]) fill what its declaration leaves at the defaults.
        own = enqueue_service.Declared(queue=task.queue_name, priority=task.priority, policy=self.policy)
        d = enqueue_service.with_options(task.module_path, own)
        if (d.queue, d.priority) != (task.queue_name, task.priority):
            validate_task_queue(task.module_path, d.queue)
            task = replace(task, queue_name=d.queue, priority=d.priority)  # what the result describes
        job = enqueue_service.Job(
            task_name=task.module_path, args=framework_payload(args, field="args"),
            kwargs=framework_payload(kwargs, field="kwargs"),
            queue=d.queue, priority=d.priority, run_after=task.run_after, unique_key=unique_key,
            backend=self.alias,
        )  # fmt: skip
        enqueued = enqueue_service.enqueue(job, now=current_clock().now(), policy=d.policy)
        if not enqueued.created:  # this task's unfinished run holding the key, shown as get_result shows it
            entry = registry.find(task.module_path)
            held = task
            if entry is not None and entry.framework_task is not None:
                held = task_results.task_of(entry, enqueued.run, backend=self.alias)
            return task_results.result_of(enqueued.run, held)
        result = task_results.enqueued(enqueued, task)
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> Any:
        if not _installed():
            raise ImproperlyConfigured(NOT_INSTALLED)
        from . import task_results

        run = _run(result_id)
        # A task declared outside a tasks module may not be imported in this process yet.
        entry = import_framework_task(run.task_name, registry)
        if entry is None or entry.framework_task is None:  # not a framework task's run
            raise TaskResultDoesNotExist(result_id)
        return task_results.result_of(run, task_results.task_of(entry, run, backend=self.alias))

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        if not _installed():
            return [checks.Error(NOT_INSTALLED, id="distsched.E012")]
        from .services.validation import QUEUE_RE

        problems: list[checks.CheckMessage] = []
        if self._policy_error:
            problems.append(
                checks.Error(f"TASKS[{self.alias!r}]['OPTIONS']: {self._policy_error}", id="distsched.E010")
            )
        for queue in sorted(self.queues):
            if not QUEUE_RE.fullmatch(queue):
                problems.append(checks.Error(
                    f"TASKS[{self.alias!r}]['QUEUES'] names {queue!r}, which is not a valid distsched queue name",
                    hint="Use 1-100 of letters, digits, '.', '-' and '_'.", id="distsched.E011",
                ))  # fmt: skip
        return problems


def _run(result_id: Any) -> Run:
    from .services.runs import get_run

    text = str(result_id)
    if not (text.isascii() and text.isdigit() and len(text) <= 19):
        raise TaskResultDoesNotExist(result_id)
    try:
        return get_run(int(text))
    except DistschedError:
        raise TaskResultDoesNotExist(result_id) from None


def enqueue_unique(task: Any, key: str, /, *args: Any, **kwargs: Any) -> Any:
    """Enqueue ``task`` unless a run of ``task`` with ``key`` is not finished yet; then return that
    run's result. Keys are per task: another task's run with the same key does not count.

    Enforced by the database (a partial unique index over active runs, on task and key), so two
    concurrent enqueuers get one run between them. A blank key is refused (``ValidationError`` on
    ``unique_key``): it would enqueue without any uniqueness.
    """
    backend = task.get_backend()
    if not isinstance(backend, DistschedBackend):
        raise InvalidTask(f"enqueue_unique needs a DistschedBackend, not {type(backend).__name__}")
    if isinstance(key, str) and not key.strip():
        raise ValidationError(f"enqueue_unique needs a unique_key that is not blank, not {key!r}", field="unique_key")
    return backend._enqueue(task, args, kwargs, unique_key=key)


async def aenqueue_unique(task: Any, key: str, /, *args: Any, **kwargs: Any) -> Any:
    from asgiref.sync import sync_to_async

    return await sync_to_async(enqueue_unique, thread_sensitive=True)(task, key, *args, **kwargs)
