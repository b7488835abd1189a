"""Create the example schedules (idempotent: existing names are left alone)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from distsched_app import Scheduler
from distsched_app.errors import DuplicateName

DEMO_SCHEDULES: list[dict[str, Any]] = [
    {
        "name": "daily-summary",
        "task_name": "demo.daily_summary",
        "kwargs": {"account_id": 42},
        "cron": "30 7 * * *",
        "timezone": "Europe/Paris",
        "catch_up": "skip",
    },
    {
        "name": "billing-sync",
        "task_name": "demo.billing_sync",
        "kwargs": {"account_id": 42, "amount_cents": 1999},
        "interval_seconds": 3600,
        "overlap": "skip",
    },
    {
        "name": "webhook-delivery",
        "task_name": "demo.deliver_webhook",
        "kwargs": {"endpoint": "https://example.invalid/hooks", "payload": {"event": "ping"}},
        "interval_seconds": 300,
        "max_attempts": 5,
        "retry_base_seconds": 5,
        "retry_max_seconds": 60,
        "retry_jitter": 0.2,
    },
    {
        "name": "long-report",
        "task_name": "demo.long_report",
        "kwargs": {"steps": 40},
        "cron": "0 * * * *",
        "timezone": "UTC",
        "overlap": "skip",
    },
    {"name": "heartbeat", "task_name": "demo.heartbeat", "interval_seconds": 60},
    # A django.tasks task on a schedule: named by its module path.
    {
        "name": "convert-amount",
        "task_name": "examples.demo.tasks.convert_amount",
        "kwargs": {"amount_cents": 1999},
        "interval_seconds": 3600,
    },
]


class Command(BaseCommand):
    help = "Create the example app's schedules if they do not exist yet."

    def handle(self, *args: Any, **options: Any) -> None:
        scheduler = Scheduler()
        for spec in DEMO_SCHEDULES:
            try:
                scheduler.create_schedule(**spec)
                self.stdout.write(f"created schedule {spec['name']}")
            except DuplicateName:
                self.stdout.write(f"schedule {spec['name']} already exists")
