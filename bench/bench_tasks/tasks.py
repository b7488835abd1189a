"""The benchmarked task: a module-level no-op, declared with the framework's decorator."""

from .framework import task


@task
def noop() -> None:
    return None
