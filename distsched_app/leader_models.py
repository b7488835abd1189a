"""The leader row: which ticker leads, under which term, until when (the database's clock).

One row per role (``scheduler``: ticks and runs the periodic chores). Written only by
``db.leader`` (in SQL, so every instant is the database's ``now()``); read by
``services.leader``. ``term`` grows by one at every change of holder: it is the fencing
token leader-only writes check in their own transaction. ``models`` re-exports it.
"""

from __future__ import annotations

from django.db import models


class Leader(models.Model):
    role = models.CharField(max_length=50, primary_key=True)
    # The campaigning process's id (a worker id: host-pid-random, never just the host name).
    holder = models.CharField(max_length=200)
    pid = models.PositiveIntegerField(null=True, blank=True)
    host = models.CharField(max_length=255, blank=True, default="")
    term = models.BigIntegerField()
    since = models.DateTimeField()
    # The lease: the holder leads while the database's now() is before it. A clean
    # step-down sets it to now(), so a standby takes over at its next try.
    expires_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.role} leader {self.holder} (term {self.term})"
