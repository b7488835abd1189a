"""Start-up guards: a misconfigured process stops with one line on stderr, not a traceback or a 500.

Why the web process checks the secret key itself: with ``DEBUG`` off and no
``DJANGO_SECRET_KEY``, settings.py leaves ``SECRET_KEY`` empty, so that the
processes that sign nothing (``runworker``, ``tick``, ``distsched ...``,
``migrate``, ``check``) run without the secret. Django notices an empty key only
when something first uses it, in the middle of a web request: every visitor
would get a 500. So ``wsgi.py`` and ``asgi.py`` call ``require_secret_key()``
before building the application, and ``manage.py`` calls it for ``runserver``:
the web process refuses to start and says why.
"""

from __future__ import annotations

import sys

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

# Also gunicorn's "worker failed to boot" code: gunicorn then stops, instead of
# restarting a worker that can never boot, over and over.
EXIT_CODE = 3

NO_SECRET_KEY = (
    "refusing to serve: DJANGO_SECRET_KEY is not set and DEBUG is off "  # noqa: S105 - a message, not a key
    "(set DJANGO_SECRET_KEY, or DJANGO_DEBUG=1 for local development; see docs/deployment.md)"
)


def fail(message: str) -> None:
    print(f"ImproperlyConfigured: {message}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_CODE)


def load_settings() -> None:
    """Import the settings now, so a malformed environment variable is one line and an exit."""
    try:
        settings.INSTALLED_APPS  # noqa: B018 - the first access imports the settings module
    except ImproperlyConfigured as exc:
        fail(str(exc))


def require_secret_key() -> None:
    """Stop a web process whose settings have no secret key."""
    load_settings()
    try:
        settings.SECRET_KEY  # noqa: B018 - Django raises here when the key is empty
    except ImproperlyConfigured:
        fail(NO_SECRET_KEY)
