"""``/api/workflows``: enqueue a workflow, list them, read one with its nodes, cancel one.

Thin: ``services.workflows`` validates and writes, ``services.workflow_ops`` reads and cancels.
Permissions are the ``Workflow`` model's: ``add_workflow`` to enqueue, ``view_workflow`` (or
``change_workflow``) to read, ``change_workflow`` to cancel.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from ..models import Workflow, WorkflowState
from ..services import workflow_ops
from ..services import workflows as workflow_service
from .errors import error_responses
from .history import changed_by, reason_of, request_actor
from .pagination import NewestFirstPagination
from .permissions import may, may_read
from .views import ApiView

ID_PARAM = OpenApiParameter("id", int, OpenApiParameter.PATH, description="The workflow's id.")
EXAMPLE = {
    "name": "onboard",
    "nodes": [
        {"id": "fetch", "task": "fetch_account", "kwargs": {"account_id": 42}},
        {"id": "bill", "task": "sync_billing", "after": ["fetch"]},
        {"id": "mail", "task": "send_welcome", "after": ["fetch"], "queue": "mail"},
        {"id": "report", "task": "summarize", "after": ["bill", "mail"], "on_upstream_failure": "run"},
    ],
}


class WorkflowSerializer(serializers.ModelSerializer):
    class Meta:
        model = Workflow
        fields = ["id", "name", "state", "created_at", "finished_at", "created_by"]


class NodeSerializer(serializers.Serializer):
    id = serializers.CharField(help_text="The node's id in the spec.")
    run = serializers.IntegerField(help_text="The node's run (`/api/runs/{run}`).")
    state = serializers.CharField(help_text="The run's state; `blocked`: waiting for its upstream nodes.")
    task = serializers.CharField()
    after = serializers.ListField(child=serializers.CharField(), help_text="Its upstream node ids.")
    on_upstream_failure = serializers.CharField()
    ended_by = serializers.IntegerField(allow_null=True, help_text="The upstream run whose failure ended it.")


class WorkflowDetailSerializer(WorkflowSerializer):
    nodes = NodeSerializer(many=True, read_only=True)

    class Meta(WorkflowSerializer.Meta):
        fields = [*WorkflowSerializer.Meta.fields, "nodes"]


class EnqueuedSerializer(serializers.Serializer):
    id = serializers.IntegerField(help_text="The workflow's id.")
    runs = serializers.DictField(child=serializers.IntegerField(), help_text="{node id: run id}.")


class SpecSerializer(serializers.Serializer):
    """What the schema shows of a spec; the service validates it (``services.workflows``)."""

    name = serializers.CharField(max_length=workflow_service.NAME_MAX)
    nodes = serializers.ListField(
        child=serializers.DictField(),
        help_text="Nodes: `id`, `task`, `args`, `kwargs`, `after` (upstream ids), `on_upstream_failure` "
        "(`cancel` | `run`), `queue`, `priority`, `max_attempts`, `retry_base_seconds`, `retry_max_seconds`.",
    )


def _detail(workflow: Workflow) -> dict[str, Any]:
    data = WorkflowSerializer(workflow).data
    data["nodes"] = NodeSerializer(workflow_ops.nodes(workflow), many=True).data
    return data


def _id(value: str) -> int:
    if not (value.isascii() and value.isdigit() and len(value) <= 18):
        raise workflow_ops.WorkflowNotFound(f"no workflow with id {value!r}")
    return int(value)


@extend_schema_view(
    list=extend_schema(
        summary="List workflows, newest first (filters: state, name)",
        parameters=[
            OpenApiParameter("state", str, enum=WorkflowState.values),
            OpenApiParameter("name", str, description="Exact name."),
        ],
        responses={200: WorkflowSerializer(many=True), **error_responses(400, 404)},
    ),
    retrieve=extend_schema(
        summary="A workflow with its nodes (id, run, state, after)",
        parameters=[ID_PARAM],
        responses={200: WorkflowDetailSerializer, **error_responses(404)},
    ),
    create=extend_schema(
        summary="Enqueue a workflow: every node's run and edge in one transaction",
        request=SpecSerializer,
        examples=[OpenApiExample("Fan-out and join", request_only=True, value=EXAMPLE)],
        responses={201: EnqueuedSerializer, **error_responses(400, 415)},
    ),
)
class WorkflowViewSet(ApiView, viewsets.GenericViewSet):
    """Workflows: runs that wait for other runs."""

    required_permissions = {
        "list": may_read("workflow"),
        "retrieve": may_read("workflow"),
        "create": may("add", "workflow"),
        "cancel": may("change", "workflow"),
    }
    queryset = Workflow.objects.all()
    lookup_field = "id"
    lookup_value_regex = "[^/]+"
    pagination_class = NewestFirstPagination
    serializer_class = WorkflowSerializer

    def get_serializer_class(self):
        return SpecSerializer if self.action == "create" else WorkflowSerializer

    def list(self, request: Request) -> Response:
        qs = workflow_ops.list_workflows(state=request.query_params.get("state"), name=request.query_params.get("name"))
        page = self.paginate_queryset(qs)
        return self.get_paginated_response(WorkflowSerializer(page, many=True).data)

    def retrieve(self, request: Request, id: str) -> Response:
        return Response(_detail(workflow_ops.get_workflow(_id(id))))

    def create(self, request: Request) -> Response:
        done = workflow_service.enqueue(request.data, now=self.now(), actor=request_actor(request))
        return Response({"id": done.id, "runs": done.runs}, status=status.HTTP_201_CREATED)

    @extend_schema(
        operation_id="workflows_cancel",
        summary="Cancel every unfinished node (waiting ones at once, running ones cooperatively)",
        parameters=[ID_PARAM],
        responses={200: WorkflowDetailSerializer, **error_responses(400, 404, 409, 415)},
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, id: str) -> Response:
        who = changed_by(request, reason_of(request))
        return Response(_detail(workflow_ops.cancel_workflow(_id(id), now=self.now(), **who)))
