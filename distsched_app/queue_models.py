"""Durable queue state: which queues are paused, and the history of pauses and resumes.

A ``QueuePause`` row exists while its queue is paused; no worker claims that
queue's runs meanwhile. The claim reads the rule through ``not_paused_sql``,
written once for both claim paths (``RunQuerySet.claimable`` and the
one-statement claim in ``db.claims``). The table holds only the queues an
operator paused, so the claim's ``queue NOT IN (SELECT ...)`` is a lookup in a
handful of rows. ``QueueEvent`` keeps every pause and resume (who, when, why),
so "who paused this and why" is still answered after the resume deleted the
pause. Both are written only by ``services.queues``; ``models`` re-exports them.
"""

from __future__ import annotations

from django.db import models


class QueueAction(models.TextChoices):
    PAUSE = "pause", "pause"
    RESUME = "resume", "resume"


class QueuePause(models.Model):
    """A paused queue: its runs wait, unclaimed, until it is resumed (the row is then deleted)."""

    queue = models.CharField(max_length=100, primary_key=True)
    paused_at = models.DateTimeField()
    # Who paused it: "user:<username>" (API, admin), "cli:<os user>" (manage.py distsched), or what code passed.
    paused_by = models.CharField(max_length=200)
    reason = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["queue"]
        verbose_name = "paused queue"
        # Pausing and resuming are both changes of a queue's state (as pausing a schedule is
        # change_schedule): no add/delete permissions, rows come and go only through services.queues.
        default_permissions = ("view", "change")

    def __str__(self) -> str:
        return self.queue


class QueueEvent(models.Model):
    """Append-only history of queue pauses and resumes; outlives the pause it records."""

    queue = models.CharField(max_length=100)
    action = models.CharField(max_length=10, choices=QueueAction.choices)
    actor = models.CharField(max_length=200)
    reason = models.TextField(blank=True, default="")
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-id"]
        default_permissions = ("view",)  # never edited, not even by a superuser
        indexes = [models.Index(fields=["queue", "-id"], name="distsched_queue_event")]

    def __str__(self) -> str:
        return f"{self.action} {self.queue} by {self.actor}"


def not_paused_sql(column: str) -> str:
    """``<column> NOT IN (SELECT queue FROM <paused queues>)``: "a paused queue's runs are not
    claimed", in SQL, for both claim paths. ``column`` is the runs' queue column as the statement
    names it. Uncorrelated, so the database reads the few paused names once per statement (a hashed
    subplan on PostgreSQL, an ephemeral table on SQLite) and the claim still walks its index."""
    return f'{column} NOT IN (SELECT "queue" FROM "{QueuePause._meta.db_table}")'  # noqa: S608 - table name only
