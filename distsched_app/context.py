"""What a running task may know about its run."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .errors import RunCancelled


def _never() -> bool:
    return False


def _nothing() -> Mapping[str, Any]:
    return {}


@dataclass(frozen=True, kw_only=True)
class RunContext:
    """Passed as ``context=`` to tasks whose signature accepts it.

    ``fencing_token`` (``"<run id>:<attempt>"``) grows with every claim of the
    run: hand it to external systems so that a late write from a worker that
    lost its lease can be told apart from the current attempt's.
    """

    run_id: int
    schedule_id: int | None
    schedule_name: str
    worker_id: str
    scheduled_for: datetime
    attempt: int
    idempotency_key: str
    _cancel_probe: Callable[[], bool] = field(default=_never, repr=False, compare=False)
    _upstream_loader: Callable[[], Mapping[str, Any]] = field(default=_nothing, repr=False, compare=False)

    @property
    def fencing_token(self) -> str:
        return f"{self.run_id}:{self.attempt}"

    @property
    def upstream_results(self) -> Mapping[str, Any]:
        """A workflow node's upstream results by node id (``{node id: result}``), read on first
        use; empty for a run outside a workflow. Nothing is ever passed positionally."""
        return self._upstream_loader()

    def cancel_requested(self) -> bool:
        """True once an operator asked to cancel this run (cooperative cancel)."""
        return self._cancel_probe()

    def raise_if_cancelled(self) -> None:
        """End the run as ``cancelled`` if a cancel was requested."""
        if self.cancel_requested():
            raise RunCancelled(f"run {self.run_id} cancelled on request")
