"""ASGI entry point (``uvicorn scheduler_project.asgi:application``); refuses to start without a secret key."""

import os

from django.core.asgi import get_asgi_application

from scheduler_project.startup import require_secret_key

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings")
require_secret_key()
application = get_asgi_application()
