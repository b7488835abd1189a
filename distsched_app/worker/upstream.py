"""A workflow node's upstream results, read once and only if its task asks for them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

from ..models import Run
from ..services import workflow_ops


def upstream_loader(run: Run) -> dict[str, Callable[[], Mapping[str, Any]]]:
    """``RunContext``'s ``_upstream_loader`` for a node of a workflow; nothing for other runs
    (they pay no query)."""
    if run.workflow_id is None:
        return {}

    @cache
    def load() -> Mapping[str, Any]:
        return workflow_ops.upstream_results(run)

    return {"_upstream_loader": load}
