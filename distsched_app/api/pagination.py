"""Cursor pagination for every list: no COUNT, no OFFSET, so page 10 000 of a
million runs costs what page 1 costs (an indexed ``WHERE id < cursor``).

Two strictnesses on top of DRF's ``CursorPagination``:

- ``page_size`` out of range or not a number is a 400, not silently the default;
- a cursor whose position does not fit the ordering column (hand-edited, or
  containing text the database cannot compare, such as NUL) is DRF's "Invalid cursor"
  404 instead of a database error.
"""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions
from rest_framework.pagination import Cursor, CursorPagination

from ..text import unstorable

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500


class StrictCursorPagination(CursorPagination):
    page_size = DEFAULT_PAGE_SIZE
    max_page_size = MAX_PAGE_SIZE
    page_size_query_param = "page_size"
    # Positions of integer orderings must parse as integers.
    integer_position = False

    def get_page_size(self, request: Any) -> int:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        if not (raw.isascii() and raw.isdigit() and 1 <= int(raw) <= self.max_page_size):
            raise exceptions.ValidationError(
                {self.page_size_query_param: [f"must be a whole number from 1 to {self.max_page_size}"]}
            )
        return int(raw)

    def decode_cursor(self, request: Any) -> Cursor | None:
        cursor = super().decode_cursor(request)
        if cursor is None or cursor.position is None:
            return cursor
        position = str(cursor.position)
        valid = unstorable(position) is None
        if self.integer_position:
            valid = valid and position.isascii() and position.lstrip("-").isdigit() and len(position) <= 19
        if not valid:
            raise exceptions.NotFound(self.invalid_cursor_message)
        return cursor

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        params = super().get_schema_operation_parameters(view)
        for param in params:
            if param["name"] == self.page_size_query_param:
                param["schema"] = {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": self.max_page_size,
                    "default": self.page_size,
                }
        return params


class NewestFirstPagination(StrictCursorPagination):
    """Runs: newest first, by primary key (the index every run list uses)."""

    ordering = "-id"
    integer_position = True


class OldestFirstPagination(StrictCursorPagination):
    """A run's events: in the order they happened."""

    ordering = "id"
    integer_position = True


class ByNamePagination(StrictCursorPagination):
    """Schedules: alphabetical by their unique, immutable name."""

    ordering = "name"


class ByWorkerIdPagination(StrictCursorPagination):
    """Workers: by their unique id."""

    ordering = "worker_id"
