"""distsched: a durable, lease-based job scheduler for Django.

Public API::

    from distsched_app import task, Scheduler, RunContext, FakeClock
"""

from typing import Any

__all__ = ["FakeClock", "RunContext", "Scheduler", "task"]
__version__ = "0.1.0"  # the one place it is written: pyproject.toml reads it, CHANGELOG.md lists it


def __getattr__(name: str) -> Any:
    # Lazy, so that importing the package (e.g. from settings) never touches models.
    if name == "task":
        from .registry import task

        return task
    if name == "Scheduler":
        from .scheduler import Scheduler

        return Scheduler
    if name == "RunContext":
        from .context import RunContext

        return RunContext
    if name == "FakeClock":
        from .clock import FakeClock

        return FakeClock
    raise AttributeError(f"module 'distsched_app' has no attribute {name!r}")
