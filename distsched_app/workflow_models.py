"""Durable workflow state: a workflow, its nodes (one run each) and the edges between them.

A workflow is a static graph written in one transaction (``services.workflows``). Each node is
a run like any other (leases, fencing, retries, limits); a node that waits for upstream nodes is
a ``blocked`` run whose ``held_by`` is ``"workflow:<id>"`` (``WAITING_PREFIX``): outside the claim
index, no lease, no attempt, no limit slot. Completion is derived from rows, never from counters:
an edge says whether its upstream has ended (``done``), and the partial index of edges not done
answers "does this node still wait for anyone?" without reading its finished siblings.
``models`` re-exports these.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

WAITING_PREFIX = "workflow:"
# The partial index of edges not done ("does this node still wait?"), named by SQLite's finish.
WAITING_EDGES_INDEX = "distsched_wf_edge_waiting"


class WorkflowState(models.TextChoices):
    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"  # every node succeeded
    FAILED = "failed", "failed"  # every node ended, some dead, cancelled or skipped
    CANCELLED = "cancelled", "cancelled"  # an operator cancelled the workflow


class UpstreamFailure(models.TextChoices):
    """What a node does when an upstream ends dead, cancelled or skipped."""

    CANCEL = "cancel", "cancel"  # it ends skipped at once, naming the upstream (the default)
    RUN = "run", "run"  # it runs once every upstream has ended, whatever the outcome ("finally")


class Workflow(models.Model):
    name = models.CharField(max_length=200)
    state = models.CharField(max_length=10, choices=WorkflowState.choices, default=WorkflowState.RUNNING)
    created_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    # Who enqueued it: "user:<name>" (API), "cli:<os user>", or "code".
    created_by = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["state", "-id"], name="distsched_wf_state_id"),
            models.Index(fields=["name", "-id"], name="distsched_wf_name_id"),
            models.Index(fields=["finished_at"], name="distsched_wf_finished", condition=Q(finished_at__isnull=False)),
            # The sweep's "any workflow in flight?": only unfinished ones are in it.
            models.Index(fields=["id"], name="distsched_wf_open", condition=Q(finished_at__isnull=True)),
        ]

    def __str__(self) -> str:
        return f"workflow {self.pk} ({self.name}, {self.state})"


class WorkflowNode(models.Model):
    """A node of a workflow: its id in the spec, its run, and its failure rule."""

    run = models.OneToOneField(
        "distsched_app.Run", primary_key=True, on_delete=models.CASCADE, related_name="workflow_node"
    )
    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="nodes", db_index=False)
    node = models.CharField(max_length=100)
    on_upstream_failure = models.CharField(
        max_length=10, choices=UpstreamFailure.choices, default=UpstreamFailure.CANCEL
    )
    # The upstream run whose failure ended this node (skipped); a requeue of that run re-opens it.
    ended_by = models.BigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["run_id"]
        default_permissions = ("view",)
        constraints = [models.UniqueConstraint(fields=["workflow", "node"], name="distsched_wf_node")]
        indexes = [models.Index(fields=["ended_by"], name="distsched_wf_ended_by", condition=Q(ended_by__isnull=False))]

    def __str__(self) -> str:
        return f"{self.node} (run {self.run_id})"


class WorkflowEdge(models.Model):
    """``downstream`` runs after ``upstream``; ``done`` once ``upstream`` has ended."""

    upstream = models.ForeignKey("distsched_app.Run", on_delete=models.CASCADE, related_name="+", db_index=False)
    downstream = models.ForeignKey("distsched_app.Run", on_delete=models.CASCADE, related_name="+", db_index=False)
    done = models.BooleanField(default=False)

    class Meta:
        default_permissions = ("view",)
        constraints = [models.UniqueConstraint(fields=["downstream", "upstream"], name="distsched_wf_edge")]
        indexes = [
            # A finishing run's own downstream edges.
            models.Index(fields=["upstream"], name="distsched_wf_edge_up"),
            # "Does this node still wait for an upstream?": only the edges not done are in it.
            models.Index(fields=["downstream"], name=WAITING_EDGES_INDEX, condition=Q(done=False)),
        ]

    def __str__(self) -> str:
        return f"run {self.upstream_id} -> run {self.downstream_id}"
