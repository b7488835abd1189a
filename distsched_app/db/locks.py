"""Row locks, where the database has them.

PostgreSQL locks the rows a transaction selects; SQLite has no row locks, and
needs none: distsched's transactions there start with ``BEGIN IMMEDIATE``
(``checks`` warns without it), which takes the database's write lock for the whole
transaction, so concurrent claimers, tickers and pruners serialise instead.
Each function returns the QuerySet unchanged where row locks do not exist.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from django.db import connection
from django.db.models import QuerySet

Q = TypeVar("Q", bound=QuerySet)


def skip_locked(qs: Q, *, of: Sequence[str] = ()) -> Q:
    """Lock the selected rows (``of``: only these tables of a join), skipping rows another
    transaction holds: ``FOR UPDATE SKIP LOCKED``, so concurrent callers take different rows."""
    if connection.features.has_select_for_update_skip_locked:
        return qs.select_for_update(skip_locked=True, of=tuple(of))
    return qs


def row_locked(qs: Q, *, of: Sequence[str] = ()) -> Q:
    """Lock the selected rows until COMMIT (``FOR UPDATE``), waiting for another holder."""
    if connection.features.has_select_for_update:
        return qs.select_for_update(of=tuple(of))
    return qs
