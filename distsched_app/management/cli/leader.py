"""``distsched leader``: which ticker leads now, by the database's clock."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from ...services import leader
from . import records
from .tables import key_values, when


def leader_record(s: leader.LeaderStatus) -> dict[str, Any]:
    """``{"holder", "pid", "host", "since", "expires_at", "term"}``; holder and pid null when nobody leads."""
    return {**s.as_dict(), "since": records.iso(s.since), "expires_at": records.iso(s.expires_at)}


def show_leader(now: datetime, o: dict[str, Any]) -> tuple[Any, str]:
    s = leader.status()
    if s.holder is None:
        text = "no leader" + (f" (last term {s.term})" if s.term else " (never elected)")
        return leader_record(s), text
    return leader_record(s), key_values(
        [
            ("holder", s.holder),
            ("pid", s.pid),
            ("host", s.host),
            ("term", s.term),
            ("since", when(s.since)),
            ("expires at", when(s.expires_at)),
        ]
    )


VERBS: dict[str, Callable[[datetime, dict[str, Any]], tuple[Any, str]]] = {"leader": show_leader}
