"""Operator figures that are costly to compute, stored so that a scrape or a page reads them.

``services.figures`` writes one row per figure (``key``) whose computation took longer than
``FIGURE_SLOW_SECONDS``: the runs counted over all history, the events of the last hour, the
dashboard's 24 hours. The leader recomputes the stored ones before they age out, so
``/metrics``, ``/api/stats`` and the dashboard cost the same at ten million runs or a million an
hour; a figure never stored (a small installation) is computed on every read, as before.
``models`` re-exports it.
"""

from __future__ import annotations

from django.db import models


class StoredFigure(models.Model):
    key = models.CharField(max_length=100, primary_key=True)
    # The clock reading of the computation: the figure describes the data as of then.
    computed_at = models.DateTimeField()
    # How long the computation took (what storing it saves each reader).
    seconds = models.FloatField()
    # The figure, pickled: it is written and read by this package only, like Django's database cache.
    value = models.BinaryField()

    def __str__(self) -> str:
        return f"figure {self.key} ({self.computed_at:%Y-%m-%d %H:%M:%S})"
