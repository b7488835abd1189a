"""``/api/schedules/{name}/history`` and ``/restore``: a schedule's versions and bringing one back
(thin: ``services.audit`` and ``services.schedules.restore_schedule``).

The actor recorded by every API change is ``user:<username>`` of the request (a session's user
or the token's), the source ``api``. The history of a deleted schedule stays readable by its
name; restoring needs the schedule to exist.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiExample, extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from ..models import AuditAction, AuditEntry, AuditSource
from ..services import audit
from ..services import queues as queue_service
from ..services import schedules as schedule_service
from .errors import error_responses
from .examples import NAME_PARAM
from .fields import StrictCharField, StrictIntegerField
from .pagination import NewestFirstPagination
from .serializers import ScheduleDetailSerializer

SOURCE = AuditSource.API


def request_actor(request: Request) -> str:
    """Who acts through the API: ``user:<username>`` of the session or of the token."""
    return queue_service.user_actor(request.user.get_username())


def changed_by(request: Request, reason: str = "") -> dict[str, str]:
    """The ``actor``, ``source`` and ``reason`` keywords the schedule and run services take."""
    return {"actor": request_actor(request), "source": SOURCE, "reason": reason}


# -------------------------------------------------------------------------- input


class ReasonSerializer(serializers.Serializer):
    """An optional body of the schedule actions (pause, resume, trigger)."""

    reason = StrictCharField(
        required=False,
        allow_blank=True,
        max_length=audit.MAX_REASON,
        trim_whitespace=False,
        help_text="Why, for whoever reads the history later.",
    )


class RestoreSerializer(ReasonSerializer):
    version = StrictIntegerField(min_value=1, help_text="The version whose configuration comes back.")
    expected_version = StrictIntegerField(
        min_value=1, required=False, help_text="Refuse (409) if the schedule is at another version by now."
    )


def reason_of(request: Request) -> str:
    body = ReasonSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    return body.validated_data.get("reason", "")


# -------------------------------------------------------------------------- output


@extend_schema_field(
    {
        "type": "object",
        "description": "The fields the change changed, `{field: [before, after]}` (system fields such as "
        "`next_run_at` are never listed).",
        "additionalProperties": {"type": "array", "items": {}, "minItems": 2, "maxItems": 2},
    }
)
class ChangesField(serializers.JSONField):
    pass


@extend_schema_field(
    {
        "type": "object",
        "nullable": True,
        "description": "The editable configuration after the change (before it, for a delete); null for a trigger.",
        "additionalProperties": True,
    }
)
class SnapshotField(serializers.JSONField):
    pass


class HistoryEntrySerializer(serializers.ModelSerializer):
    at = serializers.DateTimeField(source="created_at", read_only=True, help_text="When (ISO 8601, UTC).")
    version = serializers.IntegerField(
        read_only=True,
        allow_null=True,
        help_text="The version this change made (a trigger: the version in force, it makes none).",
    )
    action = serializers.ChoiceField(choices=AuditAction.choices, read_only=True)
    actor = serializers.CharField(
        read_only=True, help_text='Who: "user:<username>", "cli:<os user>", "code" or what code passed.'
    )
    # The metaclass takes declared fields off the class, so this shadows no Field.source at runtime.
    source = serializers.ChoiceField(choices=AuditSource.choices, read_only=True)  # type: ignore[assignment]
    changes = ChangesField(read_only=True)
    snapshot = SnapshotField(read_only=True)
    run = serializers.SerializerMethodField(help_text="A trigger's run; null otherwise.")
    restored = serializers.SerializerMethodField(help_text="A restore: the version it brought back; null otherwise.")

    class Meta:
        model = AuditEntry
        fields = [
            *("id", "version", "at", "action", "actor", "source", "reason"),
            *("changes", "snapshot", "run", "restored"),
        ]
        read_only_fields = fields

    def get_run(self, entry: AuditEntry) -> int | None:
        return (entry.data or {}).get("run")

    def get_restored(self, entry: AuditEntry) -> int | None:
        return (entry.data or {}).get("restored")


# -------------------------------------------------------------------------- the actions


class ScheduleHistoryActions:
    """Mixed into ``ScheduleViewSet``: ``history`` and ``restore`` under a schedule's URL."""

    @extend_schema(
        operation_id="schedules_history",
        summary="A schedule's versions and actions, newest first (also after it was deleted)",
        parameters=[NAME_PARAM],
        responses={200: HistoryEntrySerializer(many=True), **error_responses(400, 404)},
    )
    @action(detail=True, methods=["get"], pagination_class=NewestFirstPagination, filter_backends=[])
    def history(self, request: Request, name: str) -> Response:
        page = self.paginate_queryset(audit.schedule_history(name))  # type: ignore[attr-defined]
        return self.get_paginated_response(HistoryEntrySerializer(page, many=True).data)  # type: ignore[attr-defined]

    @extend_schema(
        operation_id="schedules_restore",
        summary="Bring back a version's configuration as a new version (whether it is paused stays as it is)",
        parameters=[NAME_PARAM],
        request=RestoreSerializer,
        examples=[OpenApiExample("Version 3", request_only=True, value={"version": 3, "reason": "the new cron"})],
        responses={200: ScheduleDetailSerializer, **error_responses(400, 404, 409, 415)},
    )
    @action(detail=True, methods=["post"])
    def restore(self, request: Request, name: str) -> Response:
        schedule_service.get_schedule(name)  # an unknown name is a 404 whatever the body
        body = RestoreSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data: dict[str, Any] = dict(body.validated_data)
        schedule = schedule_service.restore_schedule(
            name,
            data["version"],
            now=self.now(),  # type: ignore[attr-defined]
            expected_version=data.get("expected_version"),
            **changed_by(request, data.get("reason", "")),
        )
        return Response(ScheduleDetailSerializer(schedule).data)
