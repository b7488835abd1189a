"""Framework tasks shaped like those of Django's ``tests/tasks/tasks.py`` and the backport's
``tests/tasks.py`` (same behaviour, our names), for ``tests/framework/test_upstream.py``.

Deliberately outside the app's ``tasks`` module: Django's docs call ``tasks.py`` a convention.
"""

from __future__ import annotations

from typing import Any

try:
    from django.tasks import task as framework_task
except ImportError:
    from django_tasks import task as framework_task


@framework_task
def noop(*args: Any, **kwargs: Any) -> None:
    return None


@framework_task
async def noop_async(*args: Any, **kwargs: Any) -> None:
    return None


@framework_task
def meaning_of_life() -> int:
    return 42


@framework_task
def fails_with_value_error() -> None:
    raise ValueError("This Task failed due to ValueError")


@framework_task
def fails_with_system_exit() -> None:
    raise SystemExit("This Task failed due to SystemExit")


@framework_task
def fails_with_keyboard_interrupt() -> None:
    raise KeyboardInterrupt("This Task failed due to KeyboardInterrupt")


@framework_task
def raises_complex_exception() -> None:
    raise ValueError(ValueError("This task failed"))


@framework_task
def returns_a_lambda() -> Any:
    return lambda: True  # neither JSON nor picklable


@framework_task(takes_context=True)
def own_id(context: Any) -> str:
    return context.task_result.id


@framework_task(takes_context=True)
def checks_attempt(context: Any, attempt: int) -> None:
    assert context.attempt == attempt


@framework_task
def sleep_for(seconds: float) -> None:
    import time

    time.sleep(seconds)


@framework_task(priority=5)
def urgent() -> str:
    return "urgent"
