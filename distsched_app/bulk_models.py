"""Bulk actions on runs: an operator's "requeue (or cancel) every run matching this filter", kept
as a durable job that processes in batches, outside any request, and survives a crash.

A ``BulkAction`` row holds the filter as it was applied, the action, who asked and why, how far
it got (``cursor``: the highest run id processed) and who works on it now (a lease: ``lease_owner``
until ``lease_expires_at``). Only runs with an id up to ``max_run_id`` (the highest run id when the
job was created) are ever considered: runs created later are never touched. Written only by
``services.bulk``; ``models`` re-exports these.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class BulkKind(models.TextChoices):
    REQUEUE = "requeue", "requeue"
    CANCEL = "cancel", "cancel"


class BulkState(models.TextChoices):
    PENDING = "pending", "pending"  # created; no processor has started it
    RUNNING = "running", "running"  # batches are being processed (or a dead processor's lease runs out)
    DONE = "done", "done"
    FAILED = "failed", "failed"  # a batch raised an unexpected error: ``error`` says which
    CANCELLED = "cancelled", "cancelled"  # stopped by an operator; the batches done stay done


UNFINISHED_BULK_STATES = (BulkState.PENDING, BulkState.RUNNING)


class BulkAction(models.Model):
    """One bulk action: what, on which runs, by whom, and how far it got."""

    action = models.CharField(max_length=10, choices=BulkKind.choices)
    # The filter as applied (``services.run_filters``: state, schedule, task_name, queue, origin,
    # priority, created/finished bounds), JSON-ready.
    filter = models.JSONField(default=dict, blank=True)
    actor = models.CharField(max_length=200)
    source = models.CharField(max_length=10)
    reason = models.TextField(blank=True, default="")
    state = models.CharField(max_length=10, choices=BulkState.choices, default=BulkState.PENDING)
    # The highest run id when the job was created: the job never considers a run above it.
    max_run_id = models.BigIntegerField(default=0)
    # The highest run id processed so far (0: none); a resumed job goes on after it.
    cursor = models.BigIntegerField(default=0)
    matched = models.PositiveIntegerField(default=0)  # runs matching when the job was created
    done = models.PositiveIntegerField(default=0)  # runs requeued / cancelled (or asked to stop)
    skipped = models.PositiveIntegerField(default=0)  # matched in a batch but refused (a unique key held, ...)
    batches = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField()
    # Who processes it now, until when; a processor renews it with each batch. Another may take
    # the job only once it has expired (its processor died or was stopped).
    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        verbose_name = "bulk action"
        # Created through the run actions (change_run), never edited by hand.
        default_permissions = ("view",)
        indexes = [
            models.Index(fields=["id"], name="distsched_bulk_unfinished", condition=Q(state__in=["pending", "running"]))
        ]

    def __str__(self) -> str:
        return f"bulk {self.action} #{self.pk} ({self.state})"
