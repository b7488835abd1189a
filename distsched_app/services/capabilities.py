"""Worker capabilities: which tasks a worker may take.

``DISTSCHED["TASK_REQUIRES"] = {"task name": ["gpu", ...]}`` names the
capabilities a task's runs need; a worker offers some (``runworker
--capability gpu``, ``Worker(capabilities=[...])``). A run is claimed only by
a worker that has every capability its task requires; tasks that are not in
the setting run anywhere.

The claim reads the rule as a list of task names the worker may *not* take
(``excluded_tasks``), turned into ``task_name NOT IN (...)`` on both claim
paths (``RunQuerySet.claimable`` and ``db.claims``): the claim still walks its
index, and with no requirement the worker cannot meet there is no clause at all.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from django.db.models import Count

from ..conf import conf
from ..errors import ValidationError
from ..models import WAITING_STATES, Run, Worker

CAPABILITY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
CAPABILITY_RULE = "a capability name has 1-100 letters, digits, '.', '-' and '_', starting with a letter or digit"
MAX_CAPABILITIES = 100


class InvalidCapability(ValidationError):
    field = "capabilities"


def validate_capabilities(values: Any, *, field: str = "capabilities") -> list[str]:
    """Well-formed capability names, deduplicated and sorted (how the worker row stores them)."""
    if isinstance(values, str) or not isinstance(values, Iterable):
        raise InvalidCapability("capabilities must be a list of names", field=field)
    names = list(values)
    if len(names) > MAX_CAPABILITIES:
        raise InvalidCapability(f"at most {MAX_CAPABILITIES} capabilities", field=field)
    for name in names:
        if not isinstance(name, str) or not CAPABILITY_RE.fullmatch(name):
            raise InvalidCapability(f"invalid capability {name!r}: {CAPABILITY_RULE}", field=field)
    return sorted(set(names))


def task_requires_problem(value: Any) -> str | None:
    """What is wrong with a ``TASK_REQUIRES`` value, or None (``checks`` reports it as distsched.E004)."""
    if not isinstance(value, Mapping):
        return f"must be a dict of task name -> list of capability names, not {value!r}"
    for task_name, needs in value.items():
        if not isinstance(task_name, str) or not task_name or len(task_name) > 200:
            return f"has a key that is not a task name (1-200 characters): {task_name!r}"
        if isinstance(needs, str) or not isinstance(needs, list | tuple) or not needs:
            return f"[{task_name!r}] must be a non-empty list of capability names, not {needs!r}"
        bad = [n for n in needs if not isinstance(n, str) or not CAPABILITY_RE.fullmatch(n)]
        if bad:
            return f"[{task_name!r}] has an invalid capability name {bad[0]!r} ({CAPABILITY_RULE})"
    return None


def task_requires() -> dict[str, frozenset[str]]:
    """The current ``TASK_REQUIRES``, checked (a malformed value is refused, never half-applied)."""
    value = conf.TASK_REQUIRES
    problem = task_requires_problem(value)
    if problem is not None:
        raise ValidationError(f"DISTSCHED['TASK_REQUIRES'] {problem}", field="TASK_REQUIRES")
    return {task_name: frozenset(needs) for task_name, needs in value.items()}


def excluded_tasks(capabilities: Iterable[str]) -> list[str]:
    """The task names a worker with these capabilities may not take, sorted (the claim's
    ``task_name NOT IN (...)``; empty when the worker meets every requirement)."""
    have = set(capabilities)
    return sorted(task_name for task_name, needs in task_requires().items() if not needs <= have)


def missing_capabilities(task_name: str, capabilities: Iterable[str]) -> list[str]:
    """What a worker with these capabilities lacks to take a run of ``task_name``, sorted."""
    return sorted(task_requires().get(task_name, frozenset()) - set(capabilities))


def _capable(needs: frozenset[str], queue: str, workers: Iterable[tuple[list[str], list[str]]]) -> bool:
    """Whether one of these (queues, capabilities) workers serves ``queue`` with all of ``needs``."""
    return any((not queues or queue in queues) and needs <= set(caps or ()) for queues, caps in workers)


def _live_workers(now: datetime) -> list[tuple[list[str], list[str]]]:
    return list(Worker.objects.alive(now).values_list("queues", "capabilities"))


def waiting_for_capabilities(run: Run, *, now: datetime) -> list[str]:
    """The capabilities a waiting run's task requires, sorted, when no live worker (not stopped,
    fresh heartbeat) serving its queue has all of them; [] otherwise. One query over the workers,
    and none for a run that is not waiting or whose task requires nothing (a detail-page field)."""
    needs = task_requires().get(run.task_name)
    if not needs or run.state not in WAITING_STATES:
        return []
    return [] if _capable(needs, run.queue, _live_workers(now)) else sorted(needs)


def runs_without_capable_worker(now: datetime) -> int:
    """Waiting runs (pending, retrying) whose task requires capabilities that no live worker serving
    their queue has all of. Two small queries, none while ``TASK_REQUIRES`` is empty."""
    requires = task_requires()
    if not requires:
        return 0
    groups = (
        Run.objects.filter(state__in=list(WAITING_STATES), task_name__in=list(requires))
        .order_by()
        .values_list("task_name", "queue")
        .annotate(n=Count("id"))
    )
    rows = list(groups)
    if not rows:
        return 0
    workers = _live_workers(now)
    return sum(n for task_name, queue, n in rows if not _capable(requires[task_name], queue, workers))
