"""The JSON column type of every distsched model: decoded values hold only storable text."""

from __future__ import annotations

import json
from typing import Any

from django.db import models
from django.db.models.expressions import Col

from .text import StorableJSONDecoder

_decode = StorableJSONDecoder().decode
# The values most rows hold (no args, no kwargs), made without the decoder: a fresh object each.
_EMPTY: dict[str, Any] = {"[]": list, "{}": dict}


class StorableJSONField(models.JSONField):
    """A JSONField whose decoded values hold only storable text (``text.StorableJSONDecoder``),
    so a row written before that rule renders everywhere without failing.

    Migrations see a plain ``JSONField``: decoding is not part of the schema, and a
    changed field class would make SQLite rebuild the runs table on migrate.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("decoder", StorableJSONDecoder)
        super().__init__(*args, **kwargs)

    def formfield(self, form_class: Any = None, choices_form_class: Any = None, **kwargs: Any) -> Any:
        # Form input is inbound data: decoded as written, so validation can refuse what is unstorable.
        if form_class is not None:
            kwargs["form_class"] = form_class
        if choices_form_class is not None:
            kwargs["choices_form_class"] = choices_form_class
        return super().formfield(**{"decoder": None, **kwargs})

    def deconstruct(self) -> Any:
        name, _, args, kwargs = super().deconstruct()
        kwargs.pop("decoder", None)
        return name, "django.db.models.JSONField", args, kwargs

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        """A whole column (a worker reads several per run) through one shared decoder:
        ``json.loads(cls=...)`` builds a decoder for every value. Key lookups go Django's way."""
        if value is None or not isinstance(value, str) or type(expression) is not Col:
            return super().from_db_value(value, expression, connection)
        empty = _EMPTY.get(value)
        if empty is not None:
            return empty()
        try:
            return _decode(value)
        except json.JSONDecodeError:
            return value
