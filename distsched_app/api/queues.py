"""``/api/queues``: queues with their depth and pause; pause and resume (thin: ``services.queues``).

A queue is no row of its own: the list holds every queue with unfinished runs
or a pause. The actor recorded is ``user:<username>`` of the request.
Permissions are those of the ``QueuePause`` model: ``view_queuepause`` (or
``change_queuepause``) to list, ``change_queuepause`` to pause and resume.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from ..models import QueuePause
from ..services import queue_stats
from ..services import queues as queue_service
from ..services.validation import QUEUE_RE
from .errors import error_responses
from .fields import StrictCharField
from .permissions import may, may_read
from .serializers import QueuePauseSerializer
from .views import ApiView

QUEUE_PARAM = OpenApiParameter(
    "name",
    {"type": "string", "pattern": QUEUE_RE.pattern},
    OpenApiParameter.PATH,
    description="The queue's name (letters, digits, `.`, `-`, `_`; 1-100).",
)


class QueueRunsSerializer(serializers.Serializer):
    pending = serializers.IntegerField()
    retrying = serializers.IntegerField()
    blocked = serializers.IntegerField()
    leased = serializers.IntegerField()
    running = serializers.IntegerField()


class PercentilesSerializer(serializers.Serializer):
    count = serializers.IntegerField(help_text="How many runs the percentiles are over.")
    p50_seconds = serializers.FloatField(allow_null=True, source="p50")
    p95_seconds = serializers.FloatField(allow_null=True, source="p95")
    max_seconds = serializers.FloatField(allow_null=True, source="max")


class QueueSerializer(serializers.Serializer):
    queue = serializers.CharField()
    paused = serializers.BooleanField()
    runs = QueueRunsSerializer(help_text="The queue's unfinished runs by state.")
    pause = QueuePauseSerializer(allow_null=True, help_text="Who paused it, when and why; null when not paused.")
    oldest_waiting_at = serializers.DateTimeField(
        allow_null=True, help_text="When its oldest due pending or retrying run became available; null: none waits."
    )
    oldest_waiting_seconds = serializers.FloatField(allow_null=True, help_text="How long that run has waited.")
    start_lag = PercentilesSerializer(
        help_text="Start minus scheduled time of the runs that finished (succeeded or dead) in the last hour: "
        "exact nearest-rank percentiles over at most the newest 20,000."
    )
    finished_last_hour = serializers.IntegerField(help_text="Runs that finished in the last hour (any end).")
    throughput_per_minute = serializers.FloatField(help_text="finished_last_hour / 60.")
    workers = serializers.ListField(child=serializers.CharField(), help_text="Alive workers serving the queue.")
    limits = serializers.ListField(child=serializers.CharField(), help_text="Declared limits that apply to its runs.")


class QueueChangeSerializer(serializers.Serializer):
    queue = serializers.CharField()
    paused = serializers.BooleanField(help_text="Whether the queue is paused now.")
    changed = serializers.BooleanField(
        help_text="false: it already was paused (pause) or was not paused (resume), and nothing was written."
    )
    pause = QueuePauseSerializer(
        allow_null=True,
        help_text="pause: the pause in effect (the first one, when the queue already was paused); "
        "resume: the pause this request lifted (null when there was none).",
    )


class QueuePauseRequestSerializer(serializers.Serializer):
    reason = StrictCharField(
        required=False,
        allow_blank=True,
        max_length=queue_service.MAX_REASON,
        trim_whitespace=False,
        help_text="Why, for whoever looks later.",
    )


def _change(change: queue_service.QueueChange, *, paused: bool) -> dict[str, Any]:
    return QueueChangeSerializer(
        {"queue": change.queue, "paused": paused, "changed": change.changed, "pause": change.pause}
    ).data


def _actor(request: Request) -> str:
    return queue_service.user_actor(request.user.get_username())


@extend_schema_view(
    list=extend_schema(
        summary="List queues (unfinished runs, paused, a run finished in the last hour, or a worker naming them), "
        "by name: runs by state, oldest waiting, start lag p50/p95, throughput, workers, limits, pause "
        "(not paginated)",
        responses={200: QueueSerializer(many=True), **error_responses()},
    ),
)
class QueueViewSet(ApiView, viewsets.GenericViewSet):
    """Queues: a paused queue's runs are not claimed until it is resumed."""

    required_permissions = {
        "list": may_read("queuepause"),
        "pause": may("change", "queuepause"),
        "resume": may("change", "queuepause"),
    }
    queryset = QueuePause.objects.all()
    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    pagination_class = None  # one row per queue, a short list
    serializer_class = QueueSerializer

    def get_serializer_class(self):
        # What OPTIONS and the browsable API describe as input; the handlers name their serializers.
        return QueuePauseRequestSerializer if self.action == "pause" else QueueSerializer

    def list(self, request: Request) -> Response:
        found = queue_stats.queue_stats(now=self.now())
        return Response(QueueSerializer(found, many=True).data)

    @extend_schema(
        operation_id="queues_pause",
        summary="Pause: its runs are not claimed until it is resumed (pausing a paused queue changes nothing)",
        parameters=[QUEUE_PARAM],
        request=QueuePauseRequestSerializer,
        examples=[OpenApiExample("With a reason", request_only=True, value={"reason": "vendor outage"})],
        responses={200: QueueChangeSerializer, **error_responses(400, 415)},
    )
    @action(detail=True, methods=["post"])
    def pause(self, request: Request, name: str) -> Response:
        body = QueuePauseRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        change = queue_service.pause_queue(
            name, now=self.now(), by=_actor(request), reason=body.validated_data.get("reason", "")
        )
        return Response(_change(change, paused=True))

    @extend_schema(
        operation_id="queues_resume",
        summary="Resume: workers claim its runs again (resuming a queue that is not paused changes nothing)",
        parameters=[QUEUE_PARAM],
        request=None,
        responses={200: QueueChangeSerializer, **error_responses(400)},
    )
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, name: str) -> Response:
        change = queue_service.resume_queue(name, now=self.now(), by=_actor(request))
        return Response(_change(change, paused=False))
