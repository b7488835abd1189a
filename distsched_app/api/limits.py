"""``/api/limits``: the declared limits with what holds and waits for them; override and reset
(thin: ``services.limit_overrides``).

A limit is declared in ``DISTSCHED["LIMITS"]``; the list holds every declared limit, by name.
An override (``PATCH``) replaces the operator's earlier one and wins over the declaration until
it expires or is reset; each is recorded as a ``LimitEvent`` with the actor ``user:<username>``.
Permissions are those of the ``Limit`` model: ``view_limit`` (or ``change_limit``) to read,
``change_limit`` to override and reset.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    extend_schema,
    extend_schema_field,
    extend_schema_view,
)
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from .. import errors
from ..models import Limit, LimitEvent
from ..services import limit_overrides
from ..services import limit_rules as rules
from ..services import queues as queue_service
from .errors import NON_FIELD_ERRORS, error_responses
from .fields import StrictBooleanField, StrictCharField, StrictDateTimeField, StrictFloatField, StrictIntegerField
from .permissions import may, may_read
from .views import ApiView

LIMIT_PARAM = OpenApiParameter(
    "name",
    {"type": "string", "pattern": rules.NAME_RE.pattern},
    OpenApiParameter.PATH,
    description="The limit's name, as declared in `DISTSCHED['LIMITS']`.",
)
OVERRIDE_FIELDS = (*rules.NUMBERS, "paused")
# The service's names for what this API calls otherwise.
FIELDS = {"for": "for_seconds", "override": NON_FIELD_ERRORS}
HISTORY = 50


# -------------------------------------------------------------------------- output


class LimitNumbersSerializer(serializers.Serializer):
    concurrency = serializers.IntegerField(allow_null=True, help_text="Runs of one partition at a time; null: no cap.")
    total = serializers.IntegerField(allow_null=True, help_text="Runs of all partitions together; null: no cap.")
    rate = serializers.CharField(allow_null=True, help_text='Starts per period per partition ("5/s"); null: none.')
    burst = serializers.IntegerField(help_text="Starts a rate lets through at once (1: evenly spaced).")
    local = serializers.IntegerField(allow_null=True, help_text="Runs per worker; null: no cap.")
    paused = serializers.BooleanField(help_text="A paused limit admits no run.")


@extend_schema_field(
    {
        "type": "object",
        "description": "The numbers the override sets (the others are the declared ones); a null drops that cap.",
        "properties": {
            "concurrency": {"type": "integer", "nullable": True},
            "total": {"type": "integer", "nullable": True},
            "rate": {"type": "string", "nullable": True},
            "burst": {"type": "integer", "nullable": True},
            "local": {"type": "integer", "nullable": True},
            "paused": {"type": "boolean"},
        },
    }
)
class OverrideValuesField(serializers.DictField):
    pass


class LimitOverrideSerializer(serializers.Serializer):
    values = OverrideValuesField()
    by = serializers.CharField(help_text="Who set it: `user:<username>`, `cli:<os user>`, or what code passed.")
    reason = serializers.CharField(allow_blank=True)
    until = serializers.DateTimeField(allow_null=True, help_text="When it ends by itself; null: when reset.")


class LimitPartitionSerializer(serializers.Serializer):
    partition = serializers.CharField(help_text='The partition key ("" for a limit without partitions).')
    blocked = serializers.IntegerField()
    in_use = serializers.IntegerField()


class LimitSerializer(serializers.Serializer):
    name = serializers.CharField()
    tasks = serializers.ListField(child=serializers.CharField(), help_text="Tasks whose runs it applies to.")
    queues = serializers.ListField(child=serializers.CharField(), help_text="Queues whose runs it applies to.")
    partition_by = serializers.ListField(child=serializers.CharField(), help_text="Where the partition key comes from.")
    fair = serializers.BooleanField(
        help_text="A freed slot of the total goes to the partition admitted least recently."
    )
    declared = LimitNumbersSerializer(help_text="The numbers of DISTSCHED['LIMITS'].")
    override = LimitOverrideSerializer(allow_null=True, help_text="The override in force; null when none.")
    effective = LimitNumbersSerializer(help_text="What admission obeys now: the declaration under the override.")
    in_use = serializers.IntegerField(help_text="Runs holding a slot (leased or running with a live lease).")
    blocked = serializers.IntegerField(help_text="Runs waiting for a slot (state blocked).")
    throttled = serializers.IntegerField(help_text="Waiting runs whose start a rate of this limit moved later.")
    saturated_partitions = serializers.IntegerField(help_text="Partitions whose runs in use reach their concurrency.")
    top_partitions = LimitPartitionSerializer(many=True, help_text="The partitions with most blocked runs (ten).")


class LimitEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = LimitEvent
        fields = ["id", "action", "actor", "reason", "override", "until", "created_at"]
        read_only_fields = fields


class LimitDetailSerializer(LimitSerializer):
    history = LimitEventSerializer(
        many=True, help_text=f"The limit's overrides, resets and expiries, newest first ({HISTORY})."
    )


class LimitChangeSerializer(LimitSerializer):
    released = serializers.IntegerField(help_text="Blocked runs the change let through at once.")


def status_data(status: limit_overrides.LimitStatus) -> dict[str, Any]:
    return status.as_record()


# --------------------------------------------------------------------------- input


@extend_schema_field({"type": "string", "pattern": rules.RATE_RE.pattern, "nullable": True})
class RateField(StrictCharField):
    """Checked by ``limit_rules.parse_rate``; the pattern is for the schema's readers."""


class LimitOverrideRequestSerializer(serializers.Serializer):
    """Each number optional: left out, the declared one applies; null drops that cap."""

    concurrency = StrictIntegerField(required=False, allow_null=True, min_value=0, max_value=rules.MAX_COUNT)
    total = StrictIntegerField(required=False, allow_null=True, min_value=0, max_value=rules.MAX_COUNT)
    rate = RateField(required=False, allow_null=True, max_length=40, help_text='"5/s", "100/m", "1000/h", "10/30s".')
    burst = StrictIntegerField(required=False, allow_null=True, min_value=1, max_value=rules.MAX_COUNT)
    local = StrictIntegerField(required=False, allow_null=True, min_value=1, max_value=rules.MAX_COUNT)
    paused = StrictBooleanField(required=False, help_text="true: admit no run of the limit until reset or expiry.")
    reason = StrictCharField(
        required=False,
        allow_blank=True,
        max_length=queue_service.MAX_REASON,
        trim_whitespace=False,
        help_text="Why, for whoever looks later.",
    )
    for_seconds = StrictFloatField(
        required=False,
        min_value=1,
        max_value=limit_overrides.MAX_OVERRIDE_SECONDS,
        help_text="The override ends by itself this many seconds from now (not with `until`).",
    )
    until = StrictDateTimeField(required=False, help_text="The override ends by itself then (not with `for_seconds`).")


class LimitResetRequestSerializer(serializers.Serializer):
    reason = StrictCharField(
        required=False,
        allow_blank=True,
        max_length=queue_service.MAX_REASON,
        trim_whitespace=False,
        help_text="Why, for whoever looks later.",
    )


def _actor(request: Request) -> str:
    return queue_service.user_actor(request.user.get_username())


def _declared(name: str) -> None:
    """An unknown limit is a 404 whatever the body."""
    if name not in rules.declared():
        raise limit_overrides.UnknownLimit(f"no limit named {name!r} is declared in DISTSCHED['LIMITS']")


def _renamed(exc: errors.ValidationError) -> errors.ValidationError:
    """The service's error under this API's name of the field."""
    return errors.ValidationError(exc.message, field=FIELDS[exc.field]) if exc.field in FIELDS else exc


@extend_schema_view(
    list=extend_schema(
        summary="List the declared limits, by name: numbers, override, runs in use, blocked, throttled (not paginated)",
        responses={200: LimitSerializer(many=True), **error_responses()},
    ),
    retrieve=extend_schema(
        summary="Show a limit and its override history",
        parameters=[LIMIT_PARAM],
        responses={200: LimitDetailSerializer, **error_responses(404)},
    ),
    partial_update=extend_schema(
        summary="Override a limit's numbers (replacing an earlier override), for a while or until reset",
        parameters=[LIMIT_PARAM],
        request=LimitOverrideRequestSerializer,
        examples=[
            OpenApiExample(
                "Raise for an hour",
                request_only=True,
                value={"concurrency": 5, "reason": "backlog", "for_seconds": 3600},
            ),
            OpenApiExample("Pause", request_only=True, value={"paused": True, "reason": "vendor outage"}),
        ],
        responses={200: LimitChangeSerializer, **error_responses(400, 404, 415)},
    ),
)
class LimitViewSet(ApiView, viewsets.GenericViewSet):
    """Limits: caps on how many runs of some tasks or queues run at once, or how often they start."""

    required_permissions = {
        "list": may_read("limit"),
        "retrieve": may_read("limit"),
        "partial_update": may("change", "limit"),
        "reset": may("change", "limit"),
    }
    queryset = Limit.objects.all()
    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    pagination_class = None  # one row per declared limit, a short list
    serializer_class = LimitSerializer

    def get_serializer_class(self):
        # What OPTIONS and the browsable API describe as input; the handlers name their serializers.
        method = self.request.method if self.request is not None else "GET"
        if method == "PATCH":
            return LimitOverrideRequestSerializer
        if self.action == "reset":
            return LimitResetRequestSerializer
        return LimitDetailSerializer if self.detail else LimitSerializer

    def list(self, request: Request) -> Response:
        found = limit_overrides.status(self.now())
        return Response(LimitSerializer([status_data(s) for s in found], many=True).data)

    def retrieve(self, request: Request, name: str) -> Response:
        [status] = limit_overrides.status(self.now(), name=name)
        history = limit_overrides.limit_events(name, limit=HISTORY)
        return Response(LimitDetailSerializer({**status_data(status), "history": history}).data)

    def partial_update(self, request: Request, name: str) -> Response:
        _declared(name)
        body = LimitOverrideRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            change = limit_overrides.set_override(
                name,
                {k: v for k, v in data.items() if k in OVERRIDE_FIELDS},
                now=self.now(),
                by=_actor(request),
                reason=data.get("reason", ""),
                for_seconds=data.get("for_seconds"),
                until=data.get("until"),
            )
        except errors.ValidationError as exc:
            raise _renamed(exc) from None
        return self._answer(change)

    @extend_schema(
        operation_id="limits_reset",
        summary="Reset: back to the declared numbers (resetting a limit without an override changes nothing)",
        parameters=[LIMIT_PARAM],
        request=LimitResetRequestSerializer,
        examples=[OpenApiExample("With a reason", request_only=True, value={"reason": "backlog cleared"})],
        responses={200: LimitChangeSerializer, **error_responses(400, 404, 415)},
    )
    @action(detail=True, methods=["post"])
    def reset(self, request: Request, name: str) -> Response:
        _declared(name)
        body = LimitResetRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        change = limit_overrides.reset_override(
            name, now=self.now(), by=_actor(request), reason=body.validated_data.get("reason", "")
        )
        return self._answer(change)

    def _answer(self, change: limit_overrides.LimitChange) -> Response:
        [status] = limit_overrides.status(self.now(), name=change.limit)
        return Response(LimitChangeSerializer({**status_data(status), "released": change.released}).data)
