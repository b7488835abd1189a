"""Translate distsched's typed errors into HTTP answers, in one place.

    errors.ValidationError (and subclasses)  -> 400 {field: [message]}
    errors.NotFound (and subclasses)         -> 404 {"detail": message}
    errors.InvalidStateTransition            -> 409 {"detail": message}
      errors.VersionConflict                 -> 409 {"detail": message, "version": the current version}
    any other errors.DistschedError          -> 400 {"non_field_errors": [message]}
    Django's RequestDataTooBig               -> 413 {"detail": message} (not Django's HTML page)

Everything else goes through DRF's own handler (its ValidationError,
NotAuthenticated, ...), with one rule on top: every 400 has the shape of a
validation error, ``{"field": ["message", ...]}``, so a malformed JSON body is
``{"non_field_errors": ["JSON parse error - ..."]}`` rather than DRF's
``{"detail": ...}``. Every other 4xx is ``{"detail": "..."}``. The views
install this handler themselves (``get_exception_handler``), so the host
project's ``REST_FRAMEWORK["EXCEPTION_HANDLER"]`` stays untouched.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, JsonResponse
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


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "payload_too_large"


def body_too_large() -> PayloadTooLarge:
    return PayloadTooLarge(f"request body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes")


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
        return body_too_large()
    return exc


def as_field_errors(exc: exceptions.APIException) -> exceptions.ValidationError:
    """A 400 of any kind (a ParseError's ``detail`` string, a list) as ``{field: [message, ...]}``."""
    detail = exc.detail
    if isinstance(detail, dict):
        return exceptions.ValidationError(
            {field: value if isinstance(value, (list, dict)) else [value] for field, value in detail.items()}
        )
    return exceptions.ValidationError({NON_FIELD_ERRORS: detail if isinstance(detail, list) else [detail]})


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    original, exc = exc, translate(exc)
    if isinstance(exc, exceptions.APIException) and exc.status_code == status.HTTP_400_BAD_REQUEST:
        exc = as_field_errors(exc)
    response = drf_exception_handler(exc, context)
    if isinstance(original, errors.VersionConflict) and response is not None:
        response.data["version"] = original.current  # what to read again before retrying
    return response


def not_found(request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
    """Any path under /api/ that names no endpoint: the API's 404, not Django's HTML page."""
    return JsonResponse({"detail": f"no API endpoint at {request.path}"}, status=status.HTTP_404_NOT_FOUND)


# --------------------------------------------------------------------------
# OpenAPI descriptions of the error bodies

DetailSerializer = inline_serializer("ErrorDetail", fields={"detail": serializers.CharField()})

# Every 400: {"field": ["message", ...]}, or {"field": {"0": [...]}} for an item of a list or
# object field; never a bare string (``as_field_errors``).
VALIDATION_ERROR_SCHEMA = {
    "type": "object",
    "description": "Messages keyed by the input field they concern (`non_field_errors` for the whole input, "
    "malformed JSON included).",
    "additionalProperties": {
        "anyOf": [
            {"type": "array", "items": {"type": "string"}},
            {"type": "object"},
        ]
    },
}

_DESCRIPTIONS = {
    400: "Invalid input, malformed JSON included: messages by field (`non_field_errors` when no field is to blame).",
    401: "Not authenticated (no credentials, or a bad token); the `WWW-Authenticate` header names the scheme.",
    403: "Authenticated, but without the permission this action needs (`view_*` to read, `add_schedule`, "
    "`add_run`, `change_*`, `delete_schedule`), or a session write without its CSRF token.",
    404: "No such resource (or an invalid cursor).",
    409: "The current state does not allow this action: a run's state, or (with `expected_version`) a schedule "
    "changed since that version (`version` is its version now).",
    413: "The request body is larger than `DATA_UPLOAD_MAX_MEMORY_SIZE`.",
    415: "The request body is not JSON.",
}


def error_responses(*codes: int) -> dict[int, OpenApiResponse]:
    """OpenAPI responses for the given error codes, plus 401/403 which every endpoint can answer,
    and 413 wherever a JSON body is read (the endpoints that can answer 415)."""
    wanted = sorted({*codes, 401, 403, *((413,) if 415 in codes else ())})
    out: dict[int, OpenApiResponse] = {}
    for code in wanted:
        body = VALIDATION_ERROR_SCHEMA if code == 400 else DetailSerializer
        out[code] = OpenApiResponse(response=body, description=_DESCRIPTIONS[code])
    return out
