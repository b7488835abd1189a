"""``/api/runs/bulk``: requeue or cancel every run matching a filter (thin: ``services.bulk``).

``POST`` with ``dry_run`` counts (200); otherwise it creates a durable job and answers 202 with
its id and URL at once: the runs are acted on later, in batches, by the workers (or ``distsched
bulk process``), never inside the request. ``GET /api/runs/bulk/{id}`` shows its progress;
``POST /api/runs/bulk/{id}/cancel`` stops it. Creating or stopping one needs ``change_run`` (what
cancelling or requeueing one run needs); reading them, reading runs.
"""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from ..models import BulkAction, BulkKind, BulkState, Origin, RunState
from ..services import audit, run_filters
from ..services import bulk as bulk_service
from .errors import error_responses
from .fields import StrictBooleanField, StrictCharField
from .history import ReasonSerializer, changed_by, reason_of
from .pagination import NewestFirstPagination
from .permissions import may, may_read
from .views import ApiView

TEXT = {"type": "string", "minLength": 1, "maxLength": run_filters.MAX_TEXT, "pattern": "^[^\\u0000]*$"}
TIME = {"type": "string", "format": "date-time", "description": "ISO 8601 with an offset."}
STATE = {"type": "string", "enum": RunState.values}
FILTER_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "description": "The runs to act on, named like the run list's filters (none: every run the action applies to). "
    "`*_after` bounds are inclusive, `*_before` exclusive.",
    "properties": {
        "state": {"oneOf": [STATE, {"type": "array", "items": STATE, "minItems": 1}]},
        "schedule": TEXT,
        "task_name": TEXT,
        "queue": TEXT,
        "origin": {"type": "string", "enum": Origin.values},
        "priority": {"type": "integer", "minimum": -100, "maximum": 100},
        **{key: TIME for key in run_filters.TIME_KEYS},
    },
}
ID_PARAM = OpenApiParameter("id", int, OpenApiParameter.PATH, description="The bulk action's id.")


@extend_schema_field(FILTER_SCHEMA)
class FilterField(serializers.JSONField):
    """Checked by ``services.run_filters`` (400 ``filter.<key>``), not here: one vocabulary."""


# Patterns rather than enums: "action" and "state" already name other choice sets (the audit's,
# the runs'), and a second set under one name would rename those components.
@extend_schema_field(
    {"type": "string", "pattern": f"^({'|'.join(BulkKind.values)})$", "description": "requeue or cancel."}
)
class ActionField(serializers.ChoiceField):
    pass


@extend_schema_field({"type": "string", "pattern": f"^({'|'.join(BulkState.values)})$"})
class JobStateField(serializers.ChoiceField):
    pass


class BulkRequestSerializer(serializers.Serializer):
    filter = FilterField(required=False, default=dict)
    action = ActionField(choices=BulkKind.choices)
    dry_run = StrictBooleanField(required=False, default=False, help_text="Only count; write nothing.")
    reason = StrictCharField(
        required=False, allow_blank=True, max_length=audit.MAX_REASON, trim_whitespace=False,
        help_text="Why, for the action log and each run's history.",
    )  # fmt: skip


class BulkPreviewSerializer(serializers.Serializer):
    action = ActionField(choices=BulkKind.choices)
    filter = FilterField(help_text="The filter as it would be applied.")
    dry_run = serializers.BooleanField(default=True)
    count = serializers.IntegerField(help_text="The runs the action would act on now.")


class BulkActionSerializer(serializers.ModelSerializer):
    filter = FilterField(read_only=True, help_text="The filter as applied.")
    action = ActionField(choices=BulkKind.choices, read_only=True)
    state = JobStateField(choices=BulkState.choices, read_only=True)
    url = serializers.SerializerMethodField(help_text="Where to follow its progress.")
    progress = serializers.SerializerMethodField(help_text="Done and skipped out of matched, 0 to 1.")

    class Meta:
        model = BulkAction
        fields = [
            *("id", "url", "action", "filter", "state", "matched", "done", "skipped", "progress", "batches"),
            *("max_run_id", "cursor", "actor", "source", "reason", "error"),
            *("created_at", "started_at", "finished_at", "updated_at", "lease_owner", "lease_expires_at"),
        ]
        read_only_fields = fields

    def get_url(self, job: BulkAction) -> str:
        return reverse("distsched_api:bulk-action-detail", args=[job.pk])

    def get_progress(self, job: BulkAction) -> float:
        if job.state == BulkState.DONE or not job.matched:
            return 1.0 if job.state == BulkState.DONE else 0.0
        return round(min(1.0, (job.done + job.skipped) / job.matched), 4)


class BulkActionViewSet(ApiView, viewsets.GenericViewSet):
    """Bulk actions on runs: create one (or count, with ``dry_run``), list them, follow one."""

    required_permissions = {
        "create": may("change", "run"),
        "cancel": may("change", "run"),
        "list": may_read("run"),
        "retrieve": may_read("run"),
    }
    queryset = BulkAction.objects.all()
    pagination_class = NewestFirstPagination
    serializer_class = BulkActionSerializer
    lookup_value_regex = "[^/]+"

    def get_serializer_class(self):
        method = self.request.method if self.request is not None else "GET"
        return BulkRequestSerializer if method == "POST" else BulkActionSerializer

    @extend_schema(
        operation_id="runs_bulk_create",
        summary="Requeue or cancel every run matching a filter, as a background job (or only count)",
        description="With `dry_run`: 200 with the count, nothing written. Otherwise 202 with the job (its `url` "
        "shows progress): workers act on the matching runs in batches of 1,000, each run's history records it, "
        "and the action log gets one entry with the filter and the count. Only runs that exist when the job is "
        "created are considered. Needs `change_run`.",
        request=BulkRequestSerializer,
        examples=[
            OpenApiExample(
                "Requeue last night's dead runs of nightly",
                request_only=True,
                value={
                    "filter": {"state": "dead", "schedule": "nightly", "finished_after": "2026-03-01T22:00:00Z"},
                    "action": "requeue",
                    "reason": "the vendor is back",
                },
            )
        ],
        responses={200: BulkPreviewSerializer, 202: BulkActionSerializer, **error_responses(400, 415)},
    )
    def create(self, request: Request) -> Response:
        body = BulkRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data: dict[str, Any] = dict(body.validated_data)
        if data["dry_run"]:
            found = bulk_service.preview(action=data["action"], filter=data["filter"])
            document = {"action": found.action, "filter": found.filter, "dry_run": True, "count": found.count}
            return Response(document)
        job = bulk_service.create_bulk_action(
            action=data["action"], filter=data["filter"], now=self.now(), **changed_by(request, data.get("reason", ""))
        )
        answer = BulkActionSerializer(job).data
        return Response(answer, status=status.HTTP_202_ACCEPTED, headers={"Location": answer["url"]})

    @extend_schema(
        operation_id="runs_bulk_list",
        summary="Bulk actions, newest first",
        responses={200: BulkActionSerializer(many=True), **error_responses(400, 404)},
    )
    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(bulk_service.list_bulk_actions())
        return self.get_paginated_response(BulkActionSerializer(page, many=True).data)

    @extend_schema(
        operation_id="runs_bulk_retrieve",
        summary="A bulk action's progress",
        parameters=[ID_PARAM],
        responses={200: BulkActionSerializer, **error_responses(404)},
    )
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(BulkActionSerializer(bulk_service.get_bulk_action(pk)).data)

    @extend_schema(
        operation_id="runs_bulk_cancel",
        summary="Stop a pending or running bulk action (what its batches did stays done); 409 once it has ended",
        parameters=[ID_PARAM],
        request=ReasonSerializer,
        responses={200: BulkActionSerializer, **error_responses(400, 404, 409, 415)},
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        bulk_service.get_bulk_action(pk)  # an unknown id is a 404 whatever the body
        job = bulk_service.stop_bulk_action(pk, now=self.now(), **changed_by(request, reason_of(request)))
        return Response(BulkActionSerializer(job).data)
