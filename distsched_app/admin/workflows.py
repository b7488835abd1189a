"""Workflows in the admin: the list (filter by state, search by name), a page drawing the graph
(server-side SVG, node states coloured, links to runs) with its nodes, and cancel.

A thin adapter over ``services.workflow_ops``. Workflows are written only by
``workflows.enqueue`` (code, API): nothing here adds or edits one.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from ..models import Run, Workflow
from ..services import workflow_ops
from .display import change_url, state_badge, timestamp_field
from .mixins import DistschedMedia, ObjectActionsMixin, StorableLookupsMixin
from .support import apply_each, changed_by, report_problems, request_now, selected_keys
from .workflow_graph import MAX_DRAWN, layout, svg


@admin.register(Workflow)
class WorkflowAdmin(DistschedMedia, StorableLookupsMixin, ObjectActionsMixin, admin.ModelAdmin):
    list_display = ("id", "name", "state_badge", "created_at_utc", "finished_at_utc", "created_by")
    list_filter = ("state",)
    search_fields = ("name",)
    list_per_page = 100
    show_full_result_count = False
    actions = ("cancel_workflows",)
    object_actions = ("cancel",)
    fields = ("id", "name", "state_badge", "created_by", "created_at_utc", "finished_at_utc", "graph", "node_table")
    readonly_fields = fields
    created_at_utc = timestamp_field("created_at", "created (UTC)")
    finished_at_utc = timestamp_field("finished_at", "finished (UTC)")

    def has_add_permission(self, request, obj=None):
        return False  # enqueued by code or the API

    def has_delete_permission(self, request, obj=None):
        return False  # prune removes finished workflows whole

    def has_operate_permission(self, request) -> bool:
        return request.user.has_perm("distsched_app.change_workflow")

    @admin.display(description="state", ordering="state")
    def state_badge(self, obj: Workflow) -> str:
        return state_badge(obj.state)

    def _nodes(self, obj: Workflow) -> list[workflow_ops.NodeView]:
        cached = getattr(obj, "_node_views", None)
        if cached is None:
            cached = obj._node_views = workflow_ops.nodes(obj)  # type: ignore[attr-defined]
        return cached

    @admin.display(description="graph")
    def graph(self, obj: Workflow) -> str:
        nodes = self._nodes(obj)
        if len(nodes) > MAX_DRAWN:
            return f"{len(nodes)} nodes: too many to draw (at most {MAX_DRAWN}); see the table below"
        url = reverse("admin:distsched_app_run_change", args=[0]).replace("/0/", "/{}/")
        return svg(layout([(n.id, n.run, n.state, n.after) for n in nodes]), url)

    @admin.display(description="nodes")
    def node_table(self, obj: Workflow) -> str:
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td><a href='{}'>run {}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (n.id, change_url(Run, n.run), n.run, n.task, state_badge(n.state), ", ".join(n.after) or "-",
                 n.on_upstream_failure)
                for n in self._nodes(obj)[:1000]
            ),
        )  # fmt: skip
        return format_html(
            "<table class='distsched-nodes'><thead><tr><th>node</th><th>run</th><th>task</th><th>state</th>"
            "<th>after</th><th>on upstream failure</th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra = {**(extra_context or {}), "can_operate": self.has_operate_permission(request)}
        return super().change_view(request, object_id, form_url, extra)

    def check_object_action(self, request, obj, name) -> None:
        if not self.has_operate_permission(request):
            raise PermissionDenied

    def cancel_object(self, request, obj) -> None:
        outcome = apply_each([obj.pk], lambda key: self._cancel(request, key))
        if outcome.done:
            self.message_user(request, f"Cancelled workflow {obj.pk}.", messages.SUCCESS)
        report_problems(self, request, outcome, verb="cancelled", noun="workflow")

    def _cancel(self, request, key) -> None:
        workflow_ops.cancel_workflow(key, now=request_now(request), **changed_by(request))

    @admin.action(description="Cancel every unfinished node of the selected workflows")
    def cancel_workflows(self, request, queryset) -> None:
        if not self.has_operate_permission(request):
            self.message_user(request, "You may not cancel workflows.", messages.ERROR)
            return
        keys = selected_keys(self, request, queryset, "pk")
        if keys is None:
            return
        outcome = apply_each(keys, lambda key: self._cancel(request, key))
        if outcome.done:
            self.message_user(request, f"Cancelled {len(outcome.done)} workflow(s).", messages.SUCCESS)
        report_problems(self, request, outcome, verb="cancelled", noun="workflow")
