"""Example tasks, written only against distsched's public API."""

from __future__ import annotations

import logging
import random

from distsched_app import RunContext, task

logger = logging.getLogger("distsched.examples")


@task("demo.heartbeat")
def heartbeat(context: RunContext) -> dict:
    """A no-op that returns where it ran: useful to watch runs succeed."""
    return {"worker": context.worker_id, "attempt": context.attempt}


@task("demo.flaky")
def flaky(failure_rate: float = 0.5, context: RunContext | None = None) -> str:
    """Fails at random: watch retries with backoff, and dead runs in the admin."""
    if random.random() < failure_rate:
        raise RuntimeError(f"transient failure on attempt {context.attempt if context else '?'}")
    return "ok"
