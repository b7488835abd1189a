"""Runs in the admin: a fast list, a read-only page with the run's history, cancel and requeue.

Runs are never hand-edited: the change page is a view, and state changes only
through ``services.runs.cancel_run`` / ``requeue_run`` (actions or the page's
buttons). The list stays fast with a million runs: no full COUNT, no facet
counts, filter choices from small tables, the schedule joined, payloads and
tracebacks deferred, and sorting only by id. The history shown on a run's
page is ``events.RunEventInline``.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote
from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.urls import path
from django.utils.html import format_html

from ..clock import current_clock
from ..models import QueuePause, Run, RunState, Schedule, Workflow
from ..services import capabilities as capability_service
from ..services import enqueue as enqueue_service
from ..services import explain as explain_service
from ..services import queues as queue_service
from ..services import replacement, run_search, workflows
from ..services import runs as run_service
from ..services.outcomes import retry_policy_of
from . import bulk as bulk_admin
from . import dashboard
from .display import change_url, pretty_json, state_badge, timestamp_field, ts
from .display import duration as human_duration
from .events import RunEventInline
from .limits import limit_url
from .lists import (
    LargeTablePaginator,
    OriginFilter,
    PriorityFilter,
    QueueFilter,
    ScheduleFilter,
    StateFilter,
    TaskFilter,
    parse_id,
)
from .mixins import DistschedMedia, ObjectActionsMixin, StorableLookupsMixin
from .run_columns import RunColumnsMixin, with_error_head
from .run_search import KwargsSearchFilter, paginator_for
from .support import (
    apply_each,
    changed_by,
    report_problems,
    request_now,
    selected_keys,
)


@admin.register(Run)
class RunAdmin(DistschedMedia, StorableLookupsMixin, ObjectActionsMixin, RunColumnsMixin, admin.ModelAdmin):
    list_display = (
        "id",
        "task_name",
        "schedule_name",
        "state_badge",
        "attempts_of",
        "queue",
        "origin",
        "priority",
        "scheduled_col",
        "started_col",
        "duration_col",
        "lag_col",
        "error_line",
    )
    # Orders a million-row table serves from an index: id, scheduled for and started ((column, id) indexes).
    sortable_by = ("id", "scheduled_col", "started_col")
    list_display_links = ("id",)
    list_filter = (
        StateFilter,
        TaskFilter,
        QueueFilter,
        ScheduleFilter,
        OriginFilter,
        PriorityFilter,
        KwargsSearchFilter,
    )
    list_select_related = ("schedule",)
    search_fields = ("idempotency_key",)  # see get_search_results
    search_help_text = (
        "#id for one run; otherwise an idempotency key (or its beginning), a unique key, or text of the last error."
    )
    list_per_page = 50
    paginator = LargeTablePaginator
    show_full_result_count = False  # no second COUNT(*) over the whole table
    show_facets = admin.ShowFacets.NEVER  # facet counts would scan the table once per filter choice
    actions = ("cancel_runs", "requeue_runs")
    object_actions = ("cancel", "requeue")
    inlines = (RunEventInline,)
    # Columns the list never shows; a page of runs should not drag tracebacks and payloads along.
    heavy_fields = ("args", "kwargs", "last_error", "result", "schedule__args", "schedule__kwargs")
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "schedule_link",
                    "workflow_link",
                    "task_name",
                    "state_badge",
                    "origin",
                    "queue",
                    "queue_pause",
                    "waiting_for_capabilities",
                    "held_by_text",
                    "priority",
                    "unique_key_text",
                    "idempotency_key",
                    "fencing_token",
                    "cancel_requested",
                )
            },
        ),
        (
            "Timing (UTC)",
            {
                "fields": (
                    "scheduled_for_utc",
                    "available_at_utc",
                    "started_at_utc",
                    "finished_at_utc",
                    "duration",
                    "created_at_utc",
                    "updated_at_utc",
                )
            },
        ),
        (
            "Attempts and lease",
            {"fields": ("attempts", "max_attempts", "retry_policy_text", "lease_owner", "lease_expires_at_utc")},
        ),
        ("Payload and result", {"fields": ("args_json", "kwargs_json", "result_json")}),
        ("Last error", {"fields": ("error_text",)}),
    )
    readonly_fields = tuple(str(f) for _, opts in fieldsets for f in opts["fields"])
    scheduled_for_utc = timestamp_field("scheduled_for", "scheduled for", ms=True)
    available_at_utc = timestamp_field("available_at", "available at", ms=True)
    started_at_utc = timestamp_field("started_at", "started at", ms=True)
    finished_at_utc = timestamp_field("finished_at", "finished at", ms=True)
    created_at_utc = timestamp_field("created_at", "created at", ms=True)
    updated_at_utc = timestamp_field("updated_at", "updated at", ms=True)
    lease_expires_at_utc = timestamp_field("lease_expires_at", "lease expires at (UTC)", ms=True)

    def has_add_permission(self, request):
        return False  # runs come from the tick, a trigger, an enqueue (code, the API, the CLI)

    def has_change_permission(self, request, obj=None):
        return False  # run state changes only through the cancel/requeue actions

    def has_delete_permission(self, request, obj=None):
        return False  # history is pruned by `manage.py distsched prune`

    def has_operate_permission(self, request, obj=None) -> bool:
        """May cancel and requeue runs: the model's change permission."""
        return request.user.has_perm(f"{self.opts.app_label}.change_{self.opts.model_name}")

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("schedule")

    def get_changelist(self, request, **kwargs):
        heavy = self.heavy_fields
        base: Any = super().get_changelist(request, **kwargs)

        class RunChangeList(base):
            def get_queryset(self, request, exclude_parameters=None):
                return with_error_head(super().get_queryset(request, exclude_parameters).defer(*heavy))

        return RunChangeList

    def get_paginator(self, request, queryset, per_page, orphans=0, allow_empty_first_page=True):
        paginator = super().get_paginator(request, queryset, per_page, orphans, allow_empty_first_page)
        return paginator_for(request, paginator)  # a kwargs search counts at most 1,001 runs

    def lookup_allowed(self, lookup, value, request=None):
        # The kwargs search's parameters: KwargsSearchFilter validates and applies them.
        return run_search.is_search_param(lookup) or super().lookup_allowed(lookup, value, request)

    def get_search_results(self, request, queryset, search_term):
        """``#17``: run 17; ``17``: run 17, or a key or an error containing it; other text: an
        idempotency key starting with it (``nightly:2026-03``), a unique key equal to it, or the
        last error containing it."""
        term = search_term.strip()
        if not term:
            return queryset, False
        if (run_id := parse_id(term, marked=True)) is not None:
            return queryset.filter(pk=run_id), False
        match = Q(idempotency_key__startswith=term) | Q(unique_key=term) | Q(last_error__icontains=term)
        if (run_id := parse_id(term)) is not None:
            match |= Q(pk=run_id)
        return queryset.filter(match), False

    def get_urls(self):
        dashboard_url = path("dashboard/", self.admin_site.admin_view(self.dashboard_view), name="distsched_dashboard")
        return [dashboard_url, *super().get_urls()]

    def dashboard_view(self, request):
        return dashboard.view(self, request)

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        if obj is not None:
            context["why_waiting"] = why_waiting(obj, request_now(request), pause_of=lambda queue: pause_of(obj))
        return super().render_change_form(request, context, add, change, form_url, obj)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        context = {
            "can_operate": self.has_operate_permission(request),
            "cancellable_states": run_service.CANCELLABLE_AT_ONCE + run_service.CANCELLABLE_COOPERATIVELY,
            "requeueable_states": run_service.REQUEUEABLE,
            **(extra_context or {}),
        }
        return super().change_view(request, object_id, form_url, context)

    # -- columns

    @admin.display(description="schedule", ordering="schedule__name")
    def schedule_name(self, obj: Run) -> str:
        schedule = obj.schedule
        if schedule is None:
            if obj.deleted_schedule:  # the schedule was deleted; the run kept its name
                return format_html("{} <span class='distsched-muted'>(deleted)</span>", obj.deleted_schedule)
            return format_html("<span class='distsched-muted'>{}</span>", obj.origin)  # an enqueued run
        return format_html("<a href='{}'>{}</a>", change_url(Schedule, schedule.pk), schedule.name)

    @admin.display(description="schedule")
    def schedule_link(self, obj: Run) -> str:
        link = self.schedule_name(obj)
        if obj.schedule_version is None:
            return link
        return format_html("{} (made by its version {})", link, obj.schedule_version)

    @admin.display(description="state", ordering="state")
    def state_badge(self, obj: Run) -> str:
        extra = (
            " (cancel requested)" if obj.cancel_requested and obj.state in run_service.CANCELLABLE_COOPERATIVELY else ""
        )
        return format_html("{}{}", state_badge(obj.state), extra)

    @admin.display(description="waiting for capabilities")
    def waiting_for_capabilities(self, obj: Run) -> str:
        """A waiting run no live worker can take: what its task requires (one query, on the run's page only)."""
        needs = capability_service.waiting_for_capabilities(obj, now=current_clock().now())
        if not needs:
            return "-"
        return f"{', '.join(needs)} (no live worker serving queue {obj.queue} has all of them)"

    @admin.display(description="workflow")
    def workflow_link(self, obj: Run) -> str:
        """The workflow the run is a node of, linked, with the node's id (one query, on its page only)."""
        if obj.workflow_id is None:
            return "-"
        node = getattr(getattr(obj, "workflow_node", None), "node", "?")
        return format_html(
            "<a href='{}'>workflow {}</a>, node {}", change_url(Workflow, obj.workflow_id), obj.workflow_id, node
        )

    @admin.display(description="blocked behind")
    def held_by_text(self, obj: Run) -> str:
        """What a blocked run waits for: the run it replaces (overlap=replace, linked) or a limit."""
        if obj.state != RunState.BLOCKED or not obj.held_by:
            return "-"
        if (run_id := replacement.holder_id(obj.held_by)) is not None:
            return format_html(
                "<a href='{}'>run {}</a> (overlap=replace: starts once it has ended or its lease expired)",
                change_url(Run, run_id),
                run_id,
            )
        if (workflow_id := workflows.waiting_workflow(obj.held_by)) is not None:
            return format_html(
                "<a href='{}'>workflow {}</a> (its upstream nodes have not all ended)",
                change_url(Workflow, workflow_id),
                workflow_id,
            )
        return obj.held_by

    @admin.display(description="queue paused")
    def queue_pause(self, obj: Run) -> str:
        """Why a waiting run of a paused queue is not claimed (one query, on the run's page only)."""
        pause = pause_of(obj)
        if pause is None:
            return "no"
        why = format_html(": “{}”", pause.reason) if pause.reason else ""
        return format_html(
            "<a href='{}'>paused</a> by {} at {} UTC{} (its waiting runs are not claimed until it is resumed)",
            change_url(QueuePause, quote(pause.pk)),  # the admin's quoting: a queue name may hold "_"
            pause.paused_by,
            ts(pause.paused_at),
            why,
        )

    @admin.display(description="attempts")
    def attempts_of(self, obj: Run) -> str:
        return f"{obj.attempts}/{obj.max_attempts}"

    @admin.display(description="fencing token")
    def fencing_token(self, obj: Run) -> str:
        return obj.fencing_token

    @admin.display(description="unique key")
    def unique_key_text(self, obj: Run) -> str:
        return obj.unique_key or "-"

    @admin.display(description="retry policy")
    def retry_policy_text(self, obj: Run) -> str:
        """An enqueued run's own policy; a scheduled run's comes from its schedule (joined: no query)."""
        own = enqueue_service.own_policy(obj)
        if own is None and obj.retry_policy:
            return f"unreadable: {obj.retry_policy!r}"  # written by hand; the page still shows
        policy = own or retry_policy_of(obj)
        text = (
            f"{policy.max_attempts} attempt(s); retry after {policy.base:g}s, doubling up to {policy.cap:g}s; "
            f"jitter {policy.jitter:g}"
        )
        if own is not None:
            return text
        return f"{text} (the schedule's)" if obj.schedule_id is not None else f"{text} (the DISTSCHED defaults)"

    @admin.display(description="duration")
    def duration(self, obj: Run) -> str:
        if obj.started_at and obj.finished_at:
            return human_duration(obj.finished_at - obj.started_at)
        return "-"

    @admin.display(description="args")
    def args_json(self, obj: Run) -> str:
        return pretty_json(obj.args)

    @admin.display(description="kwargs")
    def kwargs_json(self, obj: Run) -> str:
        return pretty_json(obj.kwargs)

    @admin.display(description="result")
    def result_json(self, obj: Run) -> str:
        return pretty_json(obj.result) if obj.result is not None else "-"

    @admin.display(description="last error (message and traceback)")
    def error_text(self, obj: Run) -> str:
        return (
            format_html("<pre class='distsched-pre distsched-error'>{}</pre>", obj.last_error)
            if obj.last_error
            else "-"
        )

    # -- actions: one service call per run

    def _apply(self, request, keys, service, *, verb: str):
        now, by = request_now(request), changed_by(request)
        outcome = apply_each(keys, lambda run_id: service(run_id, now=now, **by))
        report_problems(self, request, outcome, verb=verb, noun="run")
        return outcome

    def _cancel(self, request, keys):
        outcome = self._apply(request, keys, run_service.cancel_run, verb="cancelled")
        stopped = [r for r in outcome.done if r.state == RunState.CANCELLED]
        asked = len(outcome.done) - len(stopped)
        if stopped:
            self.message_user(request, f"Cancelled {len(stopped)} run(s).", messages.SUCCESS)
        if asked:
            self.message_user(
                request,
                f"Asked {asked} running run(s) to stop: their tasks see context.cancel_requested().",
                messages.SUCCESS,
            )

    def _requeue(self, request, keys):
        outcome = self._apply(request, keys, run_service.requeue_run, verb="requeued")
        if outcome.done:
            self.message_user(request, f"Requeued {len(outcome.done)} run(s): pending now.", messages.SUCCESS)

    # "Select all N runs" (``select_across``): one background job for the whole filter, not this request.

    @admin.action(description="Cancel selected runs (all N matching: a background job)", permissions=["operate"])
    def cancel_runs(self, request, queryset):
        if request.POST.get("select_across") == "1":
            bulk_admin.from_changelist(self, request, "cancel")
        elif (keys := selected_keys(self, request, queryset, "pk")) is not None:
            self._cancel(request, keys)

    @admin.action(
        description="Requeue selected runs, dead or cancelled (all N matching: a background job)",
        permissions=["operate"],
    )
    def requeue_runs(self, request, queryset):
        if request.POST.get("select_across") == "1":
            bulk_admin.from_changelist(self, request, "requeue")
        elif (keys := selected_keys(self, request, queryset, "pk")) is not None:
            self._requeue(request, keys)

    def check_object_action(self, request, obj, name):
        if not self.has_operate_permission(request, obj):
            raise PermissionDenied

    def cancel_object(self, request, obj):
        self._cancel(request, [obj.pk])

    def requeue_object(self, request, obj):
        self._requeue(request, [obj.pk])


def pause_of(run: Run) -> QueuePause | None:
    """The run's queue's pause, read once per page (the "Why is it waiting?" block and the field)."""
    if not hasattr(run, "_distsched_pause"):
        run._distsched_pause = queue_service.pause_of(run.queue)  # type: ignore[attr-defined]
    return run._distsched_pause  # type: ignore[attr-defined]


def why_waiting(run: Run, now, **options: Any) -> dict[str, Any] | None:
    """The run page's "Why is it waiting?" block (``services.explain``): each reason's message, with
    links to the runs holding what it waits for, the limit's page and the queue's pause; None when
    nothing holds it back."""
    answer = explain_service.explain(run, now=now, **options)
    if not answer["waiting_for"]:
        return None
    reasons = []
    for reason in answer["waiting_for"]:
        links = [(change_url(Run, holder), f"run {holder}") for holder in reason.get("holders", ())]
        if reason.get("replaces") is not None:
            links.append((change_url(Run, reason["replaces"]), f"run {reason['replaces']}"))
        if reason.get("limit") and reason["kind"] != "blocked":
            links.append((limit_url(reason["limit"]), f"limit {reason['limit']}"))
        if reason["kind"] == "queue_paused":
            links.append((change_url(QueuePause, quote(reason["queue"])), f"pause of queue {reason['queue']}"))
        reasons.append({"kind": reason["kind"], "message": reason["message"], "links": links})
    next_start = answer["next_possible_start"]
    return {"reasons": reasons, "claimable": answer["claimable"], "next_possible_start": next_start}
