"""Translate distsched's typed errors into HTTP answers, in one place.

    errors.ValidationError (and subclasses)  -> 400 {field: [message]}
    errors.NotFound (and subclasses)         -> 404 {"detail": message}
    errors.InvalidStateTransition            -> 409 {"detail": message}
    any other errors.DistschedError          -> 400 {"non_field_errors": [message]}
    Django's RequestDataTooBig               -> 400 {"detail": message} (not Django's HTML page)

Everything else goes through DRF's own handler (its ValidationError, ParseError,
NotAuthenticated, ...), so the API has one error vocabulary. The views install
this handler themselves (``get_exception_handler``), so the host project's
``REST_FRAMEWORK["EXCEPTION_HANDLER"]`` stays untouched.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from drf_spectacular.utils import OpenApiResponse, inline_serializer
from rest_framework import exceptions, serializers, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from .. import errors

NON_FIELD_ERRORS = "non_field_errors"


class Conflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "The resource's current state does not allow this action."
    default_code = "conflict"


def translate(exc: Exception) -> Exception:
    """The DRF exception standing for a distsched error (other exceptions unchanged)."""
    if isinstance(exc, errors.ValidationError):
        return exceptions.ValidationError({exc.field or NON_FIELD_ERRORS: [exc.message]})
    if isinstance(exc, errors.NotFound):
        return exceptions.NotFound(exc.message)
    if isinstance(exc, errors.InvalidStateTransition):
        return Conflict(exc.message)
    if isinstance(exc, errors.DistschedError):
        return exceptions.ValidationError({NON_FIELD_ERRORS: [exc.message]})
    if isinstance(exc, RequestDataTooBig):
        return exceptions.ParseError(f"request body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes")
    return exc


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    return drf_exception_handler(translate(exc), context)


# --------------------------------------------------------------------------
# OpenAPI descriptions of the error bodies

DetailSerializer = inline_serializer("ErrorDetail", fields={"detail": serializers.CharField()})

# DRF's shapes: {"field": ["message", ...]} for a field, {"field": {"0": [...]}} for an item of a
# list or object field, {"detail": "..."} for an unreadable body.
VALIDATION_ERROR_SCHEMA = {
    "type": "object",
    "description": "Messages keyed by the input field they concern (`non_field_errors` for the whole input).",
    "additionalProperties": {
        "anyOf": [
            {"type": "array", "items": {"type": "string"}},
            {"type": "object"},
            {"type": "string"},
        ]
    },
}

_DESCRIPTIONS = {
    400: "Invalid input: field messages.",
    401: "Not authenticated.",
    403: "Authenticated, but not staff, or lacking the model's change permission.",
    404: "No such resource (or an invalid cursor).",
    409: "The run's current state does not allow this action.",
    415: "The request body is not JSON.",
}


def error_responses(*codes: int) -> dict[int, OpenApiResponse]:
    """OpenAPI responses for the given error codes, plus 401/403 which every endpoint can answer."""
    wanted = sorted({*codes, 401, 403})
    out: dict[int, OpenApiResponse] = {}
    for code in wanted:
        body = VALIDATION_ERROR_SCHEMA if code == 400 else DetailSerializer
        out[code] = OpenApiResponse(response=body, description=_DESCRIPTIONS[code])
    return out
