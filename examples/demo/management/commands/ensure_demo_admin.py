"""Create a local admin user for the demo, only if no superuser exists yet."""

from __future__ import annotations

import secrets
import sys
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create a local superuser for `make run` if there is none (prints its credentials)."

    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        if User.objects.filter(is_superuser=True).exists():
            self.stdout.write("admin user: already exists (use your own credentials)")
            return
        if sys.stdin.isatty():
            from django.core.management import call_command

            self.stdout.write("No admin user yet: create one.")
            call_command("createsuperuser")
            return
        password = secrets.token_urlsafe(12)
        User.objects.create_superuser("admin", "admin@localhost", password)
        self.stdout.write(f"admin user created: username=admin password={password}")
