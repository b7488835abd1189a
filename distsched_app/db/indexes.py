"""Index definitions the two databases spell differently."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models.expressions import OrderBy


class NullsOrderedIndex(models.Index):
    """An index over ordered expressions with an explicit NULLS FIRST/LAST (PostgreSQL puts NULLs
    last ascending, first descending, unless told). SQLite rejects the modifier in CREATE INDEX;
    there it is dropped where it only restates SQLite's own order (NULLs first ascending, last
    descending), and refused otherwise."""

    def create_sql(self, model: Any, schema_editor: Any, using: str = "", **kwargs: Any) -> Any:
        if schema_editor.connection.vendor != "sqlite":
            return super().create_sql(model, schema_editor, using=using, **kwargs)
        plain = self.clone()
        plain.expressions = tuple(_sqlite_order(e) for e in self.expressions)
        return models.Index.create_sql(plain, model, schema_editor, using=using, **kwargs)


def _sqlite_order(expression: Any) -> Any:
    if not isinstance(expression, OrderBy) or not (expression.nulls_first or expression.nulls_last):
        return expression
    if bool(expression.nulls_last) != expression.descending:
        raise ValueError(f"SQLite cannot index {expression!r}: its NULLs sort first ascending, last descending")
    return OrderBy(expression.expression, descending=expression.descending)
