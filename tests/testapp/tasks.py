"""Tasks used by the test suite (autodiscovered like any app's tasks module)."""

from __future__ import annotations

import os
import time

from distsched_app import RunContext, task
from distsched_app.errors import RunCancelled

CALLS: list[dict] = []


@task("tests.noop")
def noop() -> None:
    return None


@task("tests.echo")
def echo(*args, **kwargs):
    CALLS.append({"args": list(args), "kwargs": kwargs})
    return {"args": list(args), "kwargs": kwargs}


@task("tests.fail")
def fail(message: str = "boom") -> None:
    raise ValueError(message)


@task("tests.context")
def with_context(context: RunContext) -> dict:
    CALLS.append({"context": context})
    return {"fencing_token": context.fencing_token, "idempotency_key": context.idempotency_key}


@task("tests.record")
def record(context: RunContext, sleep: float = 0.0, fail_attempts: int = 0) -> None:
    """Write one row per execution; optionally sleep, optionally fail the first attempts."""
    from .models import Execution

    Execution.objects.create(
        run_id=context.run_id, attempt=context.attempt, worker_id=context.worker_id, pid=os.getpid()
    )
    if sleep:
        time.sleep(sleep)
    if context.attempt <= fail_attempts:
        raise RuntimeError(f"planned failure on attempt {context.attempt}")


@task("tests.cancellable")
def cancellable(context: RunContext, hook: str = "") -> str:
    """Calls a test hook (which may request a cancel), then honours the request."""
    if hook:
        HOOKS[hook](context)
    context.raise_if_cancelled()
    return "finished"


@task("tests.hook")
def hook(name: str, context: RunContext):
    return HOOKS[name](context)


@task("tests.raise_cancelled")
def raise_cancelled() -> None:
    raise RunCancelled("task decided to stop")


HOOKS: dict = {}


@task("tests.record_slow_first")
def record_slow_first(context: RunContext, first_sleep: float = 0.0, sleep: float = 0.0) -> None:
    """Like tests.record, but the first attempt sleeps ``first_sleep`` (a run to interrupt)."""
    from .models import Execution

    Execution.objects.create(
        run_id=context.run_id, attempt=context.attempt, worker_id=context.worker_id, pid=os.getpid()
    )
    time.sleep(first_sleep if context.attempt == 1 else sleep)


@task("tests.crash")
def crash(context: RunContext, code: int = 17) -> None:
    """A poison task: records the execution, then kills the interpreter (no outcome is ever recorded)."""
    from .models import Execution

    Execution.objects.create(
        run_id=context.run_id, attempt=context.attempt, worker_id=context.worker_id, pid=os.getpid()
    )
    os._exit(code)


# -- tasks declared with Django's task framework (django.tasks, or the backport on Django 5.2) --------

try:
    from django.tasks import task as framework_task
except ImportError:
    from django_tasks import task as framework_task


@framework_task
def ft_add(a: int, b: int) -> int:
    return a + b


@framework_task
def ft_noop() -> None:
    return None


@framework_task
def ft_fail(message: str = "framework boom") -> None:
    raise ValueError(message)


@framework_task(takes_context=True)
def ft_context(context, note: str = "") -> dict:
    return {
        "id": context.task_result.id,
        "attempt": context.attempt,
        # distsched's extras; the reference backends' TaskContext has none.
        "idempotency_key": getattr(context, "idempotency_key", None),
        "fencing_token": getattr(context, "fencing_token", None),
        "worker_ids": list(context.task_result.worker_ids),
        "note": note,
    }


@framework_task(takes_context=True)
def ft_flaky(context, fail_attempts: int = 1) -> int:
    """Fails its first ``fail_attempts`` attempts, then returns the attempt number."""
    if context.attempt <= fail_attempts:
        raise RuntimeError(f"planned failure on attempt {context.attempt}")
    return context.attempt


@framework_task
async def ft_async(x: int) -> int:
    import asyncio

    await asyncio.sleep(0)
    return x * 2


@framework_task(takes_context=True)
async def ft_async_cancellable(context) -> str:
    import asyncio

    for _ in range(200):
        if context.cancel_requested():
            context.raise_if_cancelled()
        await asyncio.sleep(0.01)
    return "not cancelled"


@framework_task(takes_context=True)
def ft_record(context, sleep: float = 0.0) -> int:
    """One row per execution (the concurrency tests count them); the first attempt sleeps ``sleep``."""
    from .models import Execution

    Execution.objects.create(
        run_id=int(context.task_result.id),
        attempt=context.attempt,
        worker_id=context.task_result.worker_ids[-1],
        pid=os.getpid(),
    )
    if sleep and context.attempt == 1:
        time.sleep(sleep)
    return context.attempt


@framework_task(priority=5, queue_name="urgent")
def ft_urgent() -> str:
    return "urgent"


@framework_task(backend="retrying", queue_name="mail", priority=-3)
def ft_mail(to: str = "") -> str:
    """Declared on the retrying backend: a hand-made enqueue follows its queue, priority and OPTIONS."""
    return to


@framework_task
async def ft_async_span() -> str:
    """The id of the span current inside the coroutine (tests/services/test_tracing.py)."""
    from opentelemetry import trace

    return format(trace.get_current_span().get_span_context().span_id, "016x")


@framework_task(takes_context=True)
def ft_child_span(context) -> None:
    """Makes a span of its own: it must nest under the run's execution span."""
    from opentelemetry import trace

    with trace.get_tracer("tests").start_as_current_span("inside the task"):
        pass


@task("tests.upstream")
def upstream(context: RunContext, value=None):
    """A workflow node: records what its upstream nodes returned, returns ``value``."""
    CALLS.append({"run_id": context.run_id, "upstream": dict(context.upstream_results)})
    return value


@framework_task(takes_context=True)
def ft_upstream(context) -> dict:
    """A workflow node declared with django.tasks: returns its upstream results (TaskContext extras)."""
    return dict(context.upstream_results)


@framework_task(takes_context=True)
async def ft_async_orm(context, note: str = "") -> dict:
    """An async task that uses the ORM (``await ...acount()``) and distsched's context extras."""
    from distsched_app.models import Run

    return {"runs": await Run.objects.acount(), "note": note, "fencing_token": context.fencing_token}


@framework_task(takes_context=True)
def ft_own_status(context) -> dict:
    """Reads its own result from the database while it executes."""
    own = ft_own_status.get_result(context.task_result.id)
    return {"status": own.status.name, "started": own.started_at is not None}


@framework_task
def ft_returns(kind: str):
    """Returns a value of the given kind: "tuple" (JSON as a list) or "set" (not JSON)."""
    return (1, 2) if kind == "tuple" else {1, 2}


# -- a task only "the new code" has: real worker processes started with DISTSCHED_TEST_NEW_CODE=1 ------
# (tests/concurrency/test_rolling_deploy.py; the old workers, without it, do not have this task)

if os.environ.get("DISTSCHED_TEST_NEW_CODE"):

    @task("tests.new_code")
    def new_code(context: RunContext) -> None:
        from .models import Execution

        Execution.objects.create(
            run_id=context.run_id, attempt=context.attempt, worker_id=context.worker_id, pid=os.getpid()
        )
