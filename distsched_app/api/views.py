"""REST endpoints: thin adapters that parse input, call one service, and render.

Each request reads the clock once (``ApiView.now``, from ``clock.current_clock``).
Typed errors raised by the
services become 400/404/409 in ``api.errors``; no scheduling rule lives here.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.urls import NoReverseMatch, reverse
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework import exceptions, status, viewsets
from rest_framework.authentication import BaseAuthentication, SessionAuthentication, TokenAuthentication
from rest_framework.decorators import action
from rest_framework.parsers import BaseParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ..clock import current_clock
from ..errors import RunNotFound
from ..models import Run, Schedule, Worker
from ..services import enqueue as enqueue_service
from ..services import explain as explain_service
from ..services import leader, queries
from ..services import runs as run_service
from ..services import schedules as schedule_service
from ..services import stats as stats_service
from .errors import error_responses, exception_handler
from .examples import CHANGE_EXAMPLES, CREATE_EXAMPLES, ENQUEUE_EXAMPLES, ID_PARAM, MAX_RUN_ID, NAME_PARAM
from .filters import RunFilter, ScheduleFilter
from .history import ReasonSerializer, ScheduleHistoryActions, changed_by, reason_of
from .pagination import ByNamePagination, ByWorkerIdPagination, NewestFirstPagination, OldestFirstPagination
from .parsers import BoundedJSONParser
from .permissions import ModelPermissions, may, may_read
from .serializers import (
    KEY_HELD_SCHEMA,
    EnqueuedRunSerializer,
    RunDetailSerializer,
    RunEnqueueSerializer,
    RunEventSerializer,
    RunExplainSerializer,
    RunSerializer,
    ScheduleChangeSerializer,
    ScheduleCreateSerializer,
    ScheduleDetailSerializer,
    ScheduleSerializer,
    StatsSerializer,
    WorkerSerializer,
    key_held,
)


class ApiView:
    """What every endpoint shares: auth, permissions, JSON-only input, error mapping, the clock.

    Authentication is set here, not read from the host's ``REST_FRAMEWORK``, so
    a host project needs no DRF settings for it.
    """

    # Token first: an anonymous request then gets 401 with "WWW-Authenticate: Token", not a bare 403.
    authentication_classes: Sequence[type[BaseAuthentication]] = [TokenAuthentication, SessionAuthentication]
    permission_classes: Sequence[Any] = [ModelPermissions]
    required_permissions: dict[str, tuple[str, ...]] | None = {}  # action -> any one of these (see permissions)
    parser_classes: Sequence[type[BaseParser]] = [BoundedJSONParser]
    _now: datetime | None = None

    def get_exception_handler(self):
        return exception_handler

    def now(self) -> datetime:
        """The request's single reading of the clock."""
        if self._now is None:
            self._now = current_clock().now()
        return self._now


def run_id(value: str) -> int:
    """A path segment as a run id; anything but a plain positive integer is an unknown run (404)."""
    if not (value.isascii() and value.isdigit() and len(value) <= 19) or not 0 < int(value) <= MAX_RUN_ID:
        raise RunNotFound(f"no run with id {value!r}")
    return int(value)


def actor(request: Request) -> str:
    return request.user.get_username()


@extend_schema_view(
    list=extend_schema(
        summary="List schedules, by name", responses={200: ScheduleSerializer(many=True), **error_responses(400, 404)}
    ),
    create=extend_schema(
        summary="Create a schedule",
        request=ScheduleCreateSerializer,
        examples=CREATE_EXAMPLES,
        responses={201: ScheduleDetailSerializer, **error_responses(400, 415)},
    ),
    retrieve=extend_schema(
        summary="Show a schedule, its next 5 fire times and its last run",
        parameters=[NAME_PARAM],
        responses={200: ScheduleDetailSerializer, **error_responses(404)},
    ),
    partial_update=extend_schema(
        summary="Change a schedule (a changed recurrence restarts from now); with `expected_version`, only if "
        "nobody changed it since (else 409)",
        parameters=[NAME_PARAM],
        request=ScheduleChangeSerializer,
        examples=CHANGE_EXAMPLES,
        responses={200: ScheduleDetailSerializer, **error_responses(400, 404, 409, 415)},
    ),
    destroy=extend_schema(
        summary="Delete a schedule: its runs and their history stay (waiting runs are cancelled, running ones "
        "asked to stop); its own history stays readable",
        parameters=[NAME_PARAM],
        responses={204: None, **error_responses(404)},
    ),
)
class ScheduleViewSet(ScheduleHistoryActions, ApiView, viewsets.GenericViewSet):
    """Schedules, addressed by their unique name."""

    required_permissions = {
        "list": may_read("schedule"),
        "retrieve": may_read("schedule"),
        "create": may("add", "schedule"),
        "partial_update": may("change", "schedule"),
        "pause": may("change", "schedule"),
        "resume": may("change", "schedule"),
        "trigger": may("change", "schedule"),
        "restore": may("change", "schedule"),
        "history": may_read("schedule"),
        "destroy": may("delete", "schedule"),
    }
    queryset = Schedule.objects.all()
    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    pagination_class = ByNamePagination
    filter_backends = [DjangoFilterBackend]
    filterset_class = ScheduleFilter
    serializer_class = ScheduleSerializer

    def get_serializer_class(self):
        # What OPTIONS and the browsable API describe as input; the handlers name their serializers.
        method = self.request.method if self.request is not None else "GET"
        if method == "POST" and not self.detail:
            return ScheduleCreateSerializer
        if method == "PATCH":
            return ScheduleChangeSerializer
        return ScheduleDetailSerializer if self.detail else ScheduleSerializer

    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(self.filter_queryset(queries.schedules()))
        return self.get_paginated_response(ScheduleSerializer(page, many=True).data)

    def create(self, request: Request) -> Response:
        serializer = ScheduleCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        options = dict(serializer.validated_data)
        schedule = schedule_service.create_schedule(
            name=options.pop("name"),
            task_name=options.pop("task_name"),
            now=self.now(),
            **changed_by(request, options.pop("reason", "")),
            **options,
        )
        return Response(ScheduleDetailSerializer(schedule).data, status=status.HTTP_201_CREATED)

    def retrieve(self, request: Request, name: str) -> Response:
        schedule = schedule_service.get_schedule(name)
        return Response(ScheduleDetailSerializer(schedule).data)

    def partial_update(self, request: Request, name: str) -> Response:
        schedule_service.get_schedule(name)  # an unknown name is a 404 whatever the body
        serializer = ScheduleChangeSerializer(data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        changes = dict(serializer.validated_data)
        schedule = schedule_service.update_schedule(
            name,
            now=self.now(),
            expected_version=changes.pop("expected_version", None),
            **changed_by(request, changes.pop("reason", "")),
            **changes,
        )
        return Response(ScheduleDetailSerializer(schedule).data)

    def destroy(self, request: Request, name: str) -> Response:
        schedule_service.delete_schedule(name, now=self.now(), **changed_by(request))
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        operation_id="schedules_pause",
        summary="Pause: create no new runs (existing runs carry on)",
        parameters=[NAME_PARAM],
        request=ReasonSerializer,
        responses={200: ScheduleDetailSerializer, **error_responses(400, 404, 415)},
    )
    @action(detail=True, methods=["post"])
    def pause(self, request: Request, name: str) -> Response:
        reason = reason_of(request)
        schedule = schedule_service.pause_schedule(name, now=self.now(), **changed_by(request, reason))
        return Response(ScheduleDetailSerializer(schedule).data)

    @extend_schema(
        operation_id="schedules_resume",
        summary="Resume: the next tick applies the catch-up policy",
        parameters=[NAME_PARAM],
        request=ReasonSerializer,
        responses={200: ScheduleDetailSerializer, **error_responses(400, 404, 415)},
    )
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, name: str) -> Response:
        reason = reason_of(request)
        schedule = schedule_service.resume_schedule(name, now=self.now(), **changed_by(request, reason))
        return Response(ScheduleDetailSerializer(schedule).data)

    @extend_schema(
        operation_id="schedules_trigger",
        summary="Create one manual run now",
        parameters=[NAME_PARAM],
        request=ReasonSerializer,
        responses={201: RunSerializer, **error_responses(400, 404, 415)},
    )
    @action(detail=True, methods=["post"])
    def trigger(self, request: Request, name: str) -> Response:
        reason = reason_of(request)
        run = schedule_service.trigger_schedule(
            name, now=self.now(), message=f"triggered by {actor(request)} via the API", **changed_by(request, reason)
        )
        return Response(RunSerializer(run).data, status=status.HTTP_201_CREATED)


@extend_schema_view(
    list=extend_schema(
        summary="List runs, newest first", responses={200: RunSerializer(many=True), **error_responses(400, 404)}
    ),
    create=extend_schema(
        summary="Enqueue a run of a registered task (no schedule; origin enqueued)",
        description="201 with the new run (`created` true). With a `unique_key` that an unfinished run of the "
        "same task (pending, leased, running or retrying) holds, nothing is written and the answer is 200 with "
        "`created` false: that run, to a caller who may read runs (`view_run` or `change_run`); otherwise only "
        "`task_name` and `unique_key` as sent. The retry options left out are DISTSCHED's defaults "
        "(`MAX_ATTEMPTS`, `RETRY_BASE_SECONDS`, `RETRY_MAX_SECONDS`, no jitter). Needs the `add_run` permission.",
        request=RunEnqueueSerializer,
        examples=ENQUEUE_EXAMPLES,
        responses={
            201: EnqueuedRunSerializer,
            200: OpenApiResponse(
                KEY_HELD_SCHEMA,
                description="An unfinished run of this task already holds `unique_key`: that run, or, to a caller "
                "who may not read runs, `{created: false, task_name, unique_key}`.",
            ),
            **error_responses(400, 415),
        },
    ),
    retrieve=extend_schema(
        summary="Show a run (and its queue's pause, when paused)",
        parameters=[ID_PARAM],
        responses={200: RunDetailSerializer, **error_responses(404)},
    ),
)
class RunViewSet(ApiView, viewsets.GenericViewSet):
    """Runs: one execution record each, with its event history."""

    required_permissions = {
        "list": may_read("run"),
        "create": may("add", "run"),
        "retrieve": may_read("run"),
        "events": may_read("run"),
        "explain": may_read("run"),
        "cancel": may("change", "run"),
        "requeue": may("change", "run"),
    }
    queryset = Run.objects.all()
    lookup_url_kwarg = "id"
    lookup_value_regex = "[^/]+"
    pagination_class = NewestFirstPagination
    filter_backends = [DjangoFilterBackend]
    filterset_class = RunFilter
    serializer_class = RunSerializer

    def get_serializer_class(self):
        # What OPTIONS and the browsable API describe as input; the handlers name their serializers.
        method = self.request.method if self.request is not None else "GET"
        return RunEnqueueSerializer if method == "POST" and not self.detail else RunSerializer

    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(self.filter_queryset(queries.runs()))
        return self.get_paginated_response(RunSerializer(page, many=True).data)

    def create(self, request: Request) -> Response:
        serializer = RunEnqueueSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = {k: v for k, v in serializer.validated_data.items() if v is not None}
        retry = {name: data.pop(name) for name in enqueue_service.POLICY_FIELDS if name in data}
        enqueued = enqueue_service.enqueue_declared(
            **data, retry=retry, now=self.now(), message=f"enqueued by {actor(request)} via the API"
        )
        if not enqueued.created and not any(request.user.has_perm(perm) for perm in may_read("run")):
            # add_run alone: the caller learns that the key is taken, not what the run holding it
            # carries (a guessed key would otherwise read another caller's run). Only what they sent.
            return Response(key_held(data["task_name"], data["unique_key"]), status=status.HTTP_200_OK)
        return Response(
            EnqueuedRunSerializer(enqueued.run, context={"created": enqueued.created}).data,
            status=status.HTTP_201_CREATED if enqueued.created else status.HTTP_200_OK,
        )

    def retrieve(self, request: Request, id: str) -> Response:
        run = run_service.get_run(run_id(id))
        return Response(RunDetailSerializer(run, context={"now": self.now()}).data)

    @extend_schema(
        operation_id="runs_events",
        summary="A run's history, oldest first",
        parameters=[ID_PARAM],
        responses={200: RunEventSerializer(many=True), **error_responses(400, 404)},
    )
    @action(detail=True, methods=["get"], pagination_class=OldestFirstPagination, filter_backends=[])
    def events(self, request: Request, id: str) -> Response:
        run = run_service.get_run(run_id(id))
        page = self.paginate_queryset(queries.run_events(run.pk))
        return self.get_paginated_response(RunEventSerializer(page, many=True).data)

    @extend_schema(
        operation_id="runs_explain",
        summary="Why the run is not running: what it waits for, and when it could start",
        description="Each reason has a `kind` and a `message`, with the kind's fields: a full limit names its "
        "partition, use, capacity and the runs holding it; a rate its next start; a paused queue or limit who "
        "paused it and why; a replacement (overlap=replace) the run it waits for. A finished run waits for "
        "nothing; a leased or running one says where it runs.",
        parameters=[ID_PARAM],
        responses={200: RunExplainSerializer, **error_responses(404)},
    )
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def explain(self, request: Request, id: str) -> Response:
        run = run_service.get_run(run_id(id))
        # The service's answer as it is (JSON-ready; RunExplainSerializer describes it): a serializer
        # would add every field a kind does not carry, as null.
        return Response(explain_service.explain(run, now=self.now()))

    @extend_schema(
        operation_id="runs_cancel",
        summary="Cancel: pending/retrying at once; leased/running cooperatively (cancel_requested)",
        parameters=[ID_PARAM],
        request=ReasonSerializer,
        responses={200: RunSerializer, **error_responses(400, 404, 409, 415)},
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, id: str) -> Response:
        run = run_service.cancel_run(run_id(id), now=self.now(), **changed_by(request, reason_of(request)))
        return Response(RunSerializer(run).data)

    @extend_schema(
        operation_id="runs_requeue",
        summary="Requeue a dead or cancelled run with a fresh attempt budget",
        parameters=[ID_PARAM],
        request=ReasonSerializer,
        responses={200: RunSerializer, **error_responses(400, 404, 409, 415)},
    )
    @action(detail=True, methods=["post"])
    def requeue(self, request: Request, id: str) -> Response:
        run = run_service.requeue_run(run_id(id), now=self.now(), **changed_by(request, reason_of(request)))
        return Response(RunSerializer(run).data)


@extend_schema_view(
    list=extend_schema(
        summary="List workers, with liveness derived from their heartbeat",
        responses={200: WorkerSerializer(many=True), **error_responses(400, 404)},
    ),
)
class WorkerViewSet(ApiView, viewsets.GenericViewSet):
    """Worker processes; `stale` when not stopped and silent for longer than STALE_AFTER_SECONDS."""

    required_permissions = {"list": may_read("worker")}
    queryset = Worker.objects.all()
    pagination_class = ByWorkerIdPagination
    serializer_class = WorkerSerializer

    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(queries.workers())
        context = {"now": self.now(), "leader": leader.status().holder}  # one read of the leader row per page
        return self.get_paginated_response(WorkerSerializer(page, many=True, context=context).data)


class StatsView(ApiView, APIView):
    """Figures for operators: the numbers behind the admin dashboard and /metrics.

    Mostly about runs (counts by state, recent failures with their errors), so
    reading them needs what reading runs needs.
    """

    required_permissions = {"get": may_read("run")}

    @extend_schema(
        operation_id="stats",
        summary="Run counts by state, schedules, workers, recent failures",
        responses={200: StatsSerializer, **error_responses()},
    )
    def get(self, request: Request, *args: Any) -> Response:
        return Response(StatsSerializer(stats_service.stats(now=self.now()).as_dict()).data)


class SchemaView(ApiView, SpectacularAPIView):
    """The OpenAPI 3 document (YAML; JSON with ?format=json), for users holding any distsched permission."""

    required_permissions = None


def login_url() -> str:
    """The admin's login page where the host mounted the admin, else ``settings.LOGIN_URL``."""
    try:
        return reverse("admin:login")
    except NoReverseMatch:
        return str(settings.LOGIN_URL)


class DocsView(ApiView, SpectacularSwaggerView):
    """Swagger UI; its JavaScript and CSS come from drf-spectacular-sidecar's static files, not a CDN.

    A browser without a session is sent to the admin login, which brings it back here.
    """

    required_permissions = None

    def handle_exception(self, exc: Exception) -> Any:
        if isinstance(exc, exceptions.NotAuthenticated):
            return redirect_to_login(self.request.get_full_path(), login_url())
        return super().handle_exception(exc)
