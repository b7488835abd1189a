"""Retention: the leader deletes finished runs older than ``DISTSCHED["RETENTION"]`` says.

``{"succeeded": "7d", "dead": "90d", "cancelled": 86400, "skipped": "1d"}``: per final
state, an age (a duration such as ``7d``, ``12h``, ``1d12h``, or seconds). A state not
named is kept forever, and the default (``{}``) deletes nothing: history is the user's
data, so removing it is something they ask for. Deletion is ``maintenance.delete_batch``
(the rule ``prune`` uses): small fenced transactions, oldest first by the ``(state,
finished_at)`` index, only finished runs (no claim ever waits on them). With a backlog, the
leader goes on at its next turn: a rest between calls was measured not to help claims at 11M
runs (``bench/README.md``), so only ``prune --pause`` paces itself.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from ..conf import conf
from ..db.leader import Term
from ..errors import ValidationError
from ..models import TERMINAL_STATES
from . import maintenance

BATCH_SIZE = 1000
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
MAX_AGE = timedelta(days=100 * 365)


def parse_age(value: object, *, state: str) -> timedelta:
    """One state's age: positive seconds, or a duration text (``7d``, ``12h``, ``90m``, ``1d12h``)."""
    field = f"RETENTION[{state!r}]"
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValidationError(f"{field} must be a duration such as '7d' or a number of seconds", field=field)
    if isinstance(value, str):
        text = value.strip().lower()
        parts = _DURATION.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise ValidationError(f"{field}: {value!r} is not a duration (use e.g. 7d, 12h, 90m, 1d12h)", field=field)
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    else:
        seconds = float(value)
    if not 0 < seconds <= MAX_AGE.total_seconds():  # NaN fails too
        raise ValidationError(f"{field} must be a positive duration of at most 100 years", field=field)
    return timedelta(seconds=seconds)


def policy(setting: object = None) -> dict[str, timedelta]:
    """``DISTSCHED["RETENTION"]`` (or ``setting``) checked: final state -> age. Empty: keep everything."""
    value = conf.RETENTION if setting is None else setting
    if value in (None, {}):
        return {}
    if not isinstance(value, dict):
        raise ValidationError("RETENTION must be a dict of final state -> age, e.g. {'succeeded': '7d'}")
    out = {}
    for state, age in value.items():
        if state not in TERMINAL_STATES:
            raise ValidationError(
                f"RETENTION: {state!r} is not a final state (use {', '.join(map(str, TERMINAL_STATES))})",
                field=f"RETENTION[{state!r}]",
            )
        out[str(state)] = parse_age(age, state=str(state))
    return out


@dataclass(frozen=True, kw_only=True)
class RetentionPass:
    """What one call deleted; ``more``: it stopped on its time budget with old runs left."""

    runs: int
    events: int
    batches: int
    more: bool


class Retention:
    """The leader's retention walk. Each ``apply`` deletes batches for about ``budget_seconds``,
    then returns so the leader can tick; the next call goes on from where this one stopped
    (a cursor per state), and a state whose walk reached its cutoff starts again from the
    oldest next time."""

    def __init__(
        self,
        *,
        batch_size: int = BATCH_SIZE,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.batch_size = batch_size
        self.monotonic = monotonic
        self.cursors: dict[str, maintenance.Cursor] = {}

    def apply(self, now: datetime, *, fence: Term | None, budget_seconds: float = 0.5) -> RetentionPass:
        ages = policy()
        stop_at = self.monotonic() + budget_seconds
        runs = events = batches = 0
        for state, age in ages.items():
            candidates = maintenance.prunable_runs(now - age, states=[state])
            while True:
                if self.monotonic() >= stop_at:
                    return RetentionPass(runs=runs, events=events, batches=batches, more=True)
                deleted, deleted_events, cursor = maintenance.delete_batch(
                    candidates, self.batch_size, self.cursors.get(state), fence=fence
                )
                if cursor is None:
                    self.cursors.pop(state, None)
                    break
                self.cursors[state] = cursor
                runs, events, batches = runs + deleted, events + deleted_events, batches + 1
        return RetentionPass(runs=runs, events=events, batches=batches, more=False)
