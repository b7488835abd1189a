"""Input fields that take JSON types at their word.

DRF's fields are lenient on purpose (``"5"`` is an integer, ``1`` a boolean,
``5`` a string), which suits HTML forms. This API speaks JSON only, so a
wrong type is a 400 ("wrong types" in the issue) and the OpenAPI schema is
exactly what the server accepts.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils.dateparse import parse_datetime
from rest_framework import serializers

# Far enough for any real schedule, near enough that the next few slots of
# the longest interval still fit in a Python datetime (year 9999).
LATEST = datetime(9000, 1, 1)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class StrictCharField(serializers.CharField):
    default_error_messages = {"invalid": "Must be a string."}

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    def to_internal_value(self, data: Any) -> int:
        if not _is_number(data) or (isinstance(data, float) and not data.is_integer()):
            self.fail("invalid")
        return super().to_internal_value(int(data))


class StrictFloatField(serializers.FloatField):
    def to_internal_value(self, data: Any) -> float:
        if not _is_number(data):
            self.fail("invalid")
        try:
            float(data)
        except OverflowError:  # an integer of 400 digits: too large, not a server error
            if self.max_value is not None:
                self.fail("max_value", max_value=self.max_value)
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class StrictDateTimeField(serializers.DateTimeField):
    """An ISO 8601 string with a time zone offset, before year 9000."""

    default_error_messages = {
        "naive": "Give a time zone offset (e.g. 'Z' or '+00:00').",
        "too_late": "Must be before 9000-01-01.",
    }

    def to_internal_value(self, data: Any) -> datetime:
        if not isinstance(data, str):
            self.fail("invalid", format="ISO 8601 with a time zone offset")
        value = super().to_internal_value(data)
        # DRF assumes the current time zone for naive input; a schedule must say what it means.
        try:
            parsed = parse_datetime(data)
        except ValueError:
            parsed = None
        if parsed is not None and parsed.tzinfo is None:
            self.fail("naive")
        if value.replace(tzinfo=None) >= LATEST:
            self.fail("too_late")
        return value
