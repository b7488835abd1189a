"""Equality of a value at a key path of a JSON column, written the way each database can index it.

PostgreSQL: containment, ``kwargs @> '{"account_id": 42}'``, which a GIN index on the column
(``USING gin (kwargs jsonb_path_ops)``, the operator's choice: docs) serves; without one it is a
filter like any other. For a scalar at the path, containment is equality: ``{"a": [42]}`` does not
contain ``{"a": 42}`` (only a top-level array contains its elements). SQLite: ``json_extract``
equality through Django's key transform (SQLite has no containment operator).
"""

from __future__ import annotations

from typing import Any

from django.db import connections
from django.db.models import Q


def key_equals(column: str, path: list[str], value: Any, *, using: str = "default") -> Q:
    """``column``'s value at ``path`` equals ``value`` (a JSON scalar), compared as JSON."""
    if connections[using].vendor == "postgresql":
        nested: Any = value
        for key in reversed(path):
            nested = {key: nested}
        return Q(**{f"{column}__contains": nested})
    return Q(**{f"{column}__{'__'.join(path)}": value})
