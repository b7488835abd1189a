"""WSGI entry point (``gunicorn scheduler_project.wsgi``); refuses to start without a secret key."""

import os

from django.core.wsgi import get_wsgi_application

from scheduler_project.startup import require_secret_key

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings")
require_secret_key()
application = get_wsgi_application()
