"""A table that records every execution of a test task, for the concurrency tests."""

from django.db import models


class Execution(models.Model):
    run_id = models.BigIntegerField(db_index=True)
    attempt = models.PositiveIntegerField()
    worker_id = models.CharField(max_length=200)
    pid = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"run {self.run_id} attempt {self.attempt} by {self.worker_id}"
