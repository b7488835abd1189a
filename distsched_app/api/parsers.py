"""The API's only request parser: JSON, bounded, so no body can cause a 500.

DRF's ``JSONParser`` turns syntax errors into 400s, but not a body nested a few
thousand levels deep (``RecursionError`` in the decoder, or later in any code
that walks the data) nor ``1e999`` (which parses as infinity). This parser
rejects both as 400s, and bodies larger than ``DATA_UPLOAD_MAX_MEMORY_SIZE`` as 413s.
"""

from __future__ import annotations

import codecs
import json
import math
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser
from rest_framework.utils.json import strict_constant

from ..text import nesting_exceeds
from .errors import body_too_large

MAX_DEPTH = 64


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range")
    return value


class BoundedJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Mapping[str, Any] | None = None) -> Any:
        parser_context = parser_context or {}
        encoding = parser_context.get("encoding", settings.DEFAULT_CHARSET)
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        raw = stream.read() if limit is None else stream.read(limit + 1)
        if limit is not None and len(raw) > limit:
            raise body_too_large()
        try:
            text = codecs.decode(raw, encoding)
            data = json.loads(text, parse_constant=strict_constant, parse_float=_finite_float)
        except RecursionError:
            raise ParseError(f"JSON parse error - nested deeper than {MAX_DEPTH} levels") from None
        except (ValueError, LookupError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        if nesting_exceeds(data, MAX_DEPTH):
            raise ParseError(f"JSON parse error - nested deeper than {MAX_DEPTH} levels")
        return data
