"""The audit trail: every change of a schedule (its versions) and every other operator action
(runs cancelled, requeued; queues paused, resumed; limits overridden), one table.

An entry is written in the transaction of the change it records, by ``services.audit`` only
(called by the services that make the change, never by signals: bulk writes and actors outside
a request would escape those). Entries name their target by kind and name (a schedule's name,
a run's id, a queue's or limit's name) and keep a schedule's id as a plain number, not a
foreign key, so the trail outlives what it describes. ``models`` re-exports these.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class AuditTarget(models.TextChoices):
    SCHEDULE = "schedule", "schedule"
    RUN = "run", "run"
    QUEUE = "queue", "queue"
    LIMIT = "limit", "limit"
    BULK = "bulk", "bulk action"  # an action on every run matching a filter (``services.bulk``)
    WORKFLOW = "workflow", "workflow"


class AuditAction(models.TextChoices):
    # schedules: each but trigger makes a new version
    CREATE = "create", "create"
    UPDATE = "update", "update"
    PAUSE = "pause", "pause"  # also queues
    RESUME = "resume", "resume"  # also queues
    TRIGGER = "trigger", "trigger"  # a manual run; the schedule itself is unchanged (no new version)
    DELETE = "delete", "delete"
    RESTORE = "restore", "restore"
    # runs
    CANCEL = "cancel", "cancel"
    REQUEUE = "requeue", "requeue"
    # limits
    OVERRIDE = "override", "override"
    RESET = "reset", "reset"
    EXPIRED = "expired", "expired"
    # bulk actions: created with the run action (cancel, requeue); stopped by an operator
    STOP = "stop", "stop"


class AuditSource(models.TextChoices):
    ADMIN = "admin", "admin"
    API = "api", "api"
    CLI = "cli", "cli"
    CODE = "code", "code"
    SETTINGS = "settings", "settings"
    SYSTEM = "system", "system"  # distsched itself (an override's time is up)


# Actions on a schedule that do not make a version (and so share its current one).
UNVERSIONED = (AuditAction.TRIGGER,)


class AuditEntry(models.Model):
    """One change or action: what, to what, by whom, from where, why, and (for schedules) the
    version it made, the fields it changed and the configuration after it."""

    target_kind = models.CharField(max_length=10, choices=AuditTarget.choices)
    # A schedule's or queue's or limit's name, a run's id.
    target = models.CharField(max_length=200)
    # The schedule row's id (schedules, and the runs of one): a number, not a foreign key, so the
    # entry outlives the row. A name taken again by a new schedule continues the name's versions.
    schedule_id = models.BigIntegerField(null=True, blank=True)
    # Schedules: the version this change made (a trigger: the version in force); else None.
    version = models.PositiveIntegerField(null=True, blank=True)
    action = models.CharField(max_length=10, choices=AuditAction.choices)
    # "user:<username>" (admin, API session or token), "cli:<os user>", "code", or what code passed.
    actor = models.CharField(max_length=200)
    source = models.CharField(max_length=10, choices=AuditSource.choices)
    reason = models.TextField(blank=True, default="")
    # {field: [before, after]} of the editable configuration; system fields (next_run_at, ...) left out.
    changes = models.JSONField(default=dict, blank=True)
    # Schedules: the editable configuration after the change (before it, for a delete).
    snapshot = models.JSONField(null=True, blank=True)
    # What else the action concerns: the run a trigger made, a run's new state, a limit's override.
    data = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-id"]
        verbose_name = "audit entry"
        verbose_name_plural = "audit log"
        default_permissions = ("view",)  # never edited, not even by a superuser
        indexes = [models.Index(fields=["target_kind", "target", "-id"], name="distsched_audit_target")]
        constraints = [
            # A name's versions never repeat, whoever races (the database decides).
            models.UniqueConstraint(
                fields=["target", "version"],
                condition=Q(target_kind="schedule") & ~Q(action="trigger"),
                name="distsched_audit_version",
            ),
        ]

    def __str__(self) -> str:
        version = f" v{self.version}" if self.version is not None else ""
        return f"{self.action} {self.target_kind} {self.target}{version} by {self.actor}"
