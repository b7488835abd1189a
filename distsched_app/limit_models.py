"""Durable flow-control state: operators' overrides of limits, the partition rows admission
serialises on, who holds a slot, and the history of overrides.

The limits themselves are declared in ``DISTSCHED["LIMITS"]`` (``services.limit_rules``);
nothing here repeats them. Occupancy is never a counter: a ``LimitHold`` row says a run was
admitted under a limit's partition at an attempt, and it counts only while that run still
holds a live lease at that attempt (``services.limits``), so a row a crash left behind frees
its slot when the lease expires, like the run itself. Written only by ``services.limits``;
``models`` re-exports them.
"""

from __future__ import annotations

from django.db import models


class LimitAction(models.TextChoices):
    SET = "set", "set"
    RESET = "reset", "reset"
    EXPIRED = "expired", "expired"


class Limit(models.Model):
    """One row per limit an operator overrode, or whose whole-limit cap (``total``) admission
    locked: the serialisation point of a limit shared by its partitions."""

    name = models.SlugField(max_length=100, primary_key=True)
    # The operator's numbers over the declared ones: {"concurrency", "total", "rate", "local",
    # "paused"}, each optional; None: the declaration applies.
    override = models.JSONField(null=True, blank=True)
    override_by = models.CharField(max_length=200, blank=True, default="")
    override_reason = models.TextField(blank=True, default="")
    override_at = models.DateTimeField(null=True, blank=True)
    # The override ends by itself then (None: until reset).
    override_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "limit override"
        default_permissions = ("view", "change")

    def __str__(self) -> str:
        return self.name


class LimitPartition(models.Model):
    """A limit's partition (``key`` "" when it has none): locked by every admission into it, and
    carrying its rate state (GCRA's theoretical arrival time) and when it last admitted a run
    (fairness). Created on first use, removed by the sweep when idle."""

    limit = models.CharField(max_length=100)
    key = models.CharField(max_length=200)
    tat = models.DateTimeField(null=True, blank=True)
    last_admitted_at = models.DateTimeField(null=True, blank=True)
    # When a release last let blocked runs through: the sweep leaves the partition alone for a
    # while after, since those runs are pending, not yet claimed (else it would let more through).
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["limit", "key"]
        default_permissions = ("view",)
        constraints = [models.UniqueConstraint(fields=["limit", "key"], name="distsched_limit_partition")]

    def __str__(self) -> str:
        return f"{self.limit}:{self.key}"


class LimitHold(models.Model):
    """A run admitted into a limit's partition at ``attempt`` (and by which worker, for
    ``local``). Counts while the run is leased or running at that attempt with a live lease."""

    # No constraint in the database: a hold is written and deleted with every limited run, and the
    # constraint's check at COMMIT (a lookup and a key-share lock of a run the claim already holds)
    # cost about a third of the hold's own write on PostgreSQL. A hold whose run is gone counts for
    # nothing (a slot is a hold joined to its run's live lease), and runs are deleted with their
    # holds all the same (Django's cascade, ``db.run_delete``).
    run = models.ForeignKey(
        "distsched_app.Run", on_delete=models.CASCADE, related_name="+", db_index=False, db_constraint=False
    )
    limit = models.CharField(max_length=100)
    key = models.CharField(max_length=200)
    attempt = models.PositiveIntegerField()
    worker_id = models.CharField(max_length=200)
    # Admitted while the limit was more than half full (or under a total or a rate): its release
    # takes the partition's lock even when no blocked run is visible yet (``limits.release``).
    tight = models.BooleanField(default=True)
    # Which of the partition's stripes admitted it (PostgreSQL, a large unpartitioned concurrency
    # cap split over lock stripes, ``services.limits``); 0 everywhere else.
    stripe = models.PositiveSmallIntegerField(default=0, db_default=0)

    class Meta:
        default_permissions = ("view",)
        constraints = [models.UniqueConstraint(fields=["run", "limit"], name="distsched_limit_hold")]
        indexes = [models.Index(fields=["limit", "key"], name="distsched_limit_hold_key")]

    def __str__(self) -> str:
        return f"run {self.run_id} holds {self.limit}:{self.key}"


class LimitEvent(models.Model):
    """Append-only history of overrides (set, reset, expired): who, when, why, what."""

    limit = models.CharField(max_length=100)
    action = models.CharField(max_length=10, choices=LimitAction.choices)
    actor = models.CharField(max_length=200)
    reason = models.TextField(blank=True, default="")
    override = models.JSONField(null=True, blank=True)
    until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-id"]
        default_permissions = ("view",)
        indexes = [models.Index(fields=["limit", "-id"], name="distsched_limit_event")]

    def __str__(self) -> str:
        return f"{self.action} {self.limit} by {self.actor}"
