"""Settings for the ready-to-run distsched project.

Everything a deployment changes comes from environment variables, read strictly
by ``scheduler_project.env`` (a malformed value stops start-up with one line);
``docs/deployment.md`` lists them with their defaults. ``DEBUG`` is off unless
``DJANGO_DEBUG=1`` (``make run`` sets it), and with ``DEBUG`` off the security
settings default to what production over HTTPS needs.

The database comes from ``DATABASE_URL`` (default: a SQLite file next to
manage.py). SQLite is tuned for several processes on one file: WAL journal,
``BEGIN IMMEDIATE`` transactions (so a claim takes the write lock up front
instead of failing on upgrade) and a generous busy timeout.
"""

from pathlib import Path
from typing import Any

import dj_database_url
import django
from django.core.exceptions import ImproperlyConfigured

from scheduler_project import env

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = env.flag("DJANGO_DEBUG", default=False)

# Without DJANGO_SECRET_KEY and with DEBUG off the key stays empty: workers and
# commands that sign nothing run without it, and the web entry points refuse to
# start (scheduler_project/startup.py says why there rather than here).
DEVELOPMENT_SECRET_KEY = "django-insecure-development-only-key-never-use-in-production"  # noqa: S105 - DEBUG only
SECRET_KEY = env.raw("DJANGO_SECRET_KEY") or (DEVELOPMENT_SECRET_KEY if DEBUG else "")

ALLOWED_HOSTS = env.hosts("DJANGO_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.origins("DJANGO_CSRF_TRUSTED_ORIGINS")

# HTTPS. Behind a TLS-terminating proxy, DJANGO_SECURE_PROXY_SSL_HEADER names the
# header the proxy sets to "https"; without it every request looks like plain
# HTTP and the SSL redirect would loop.
SECURE_PROXY_SSL_HEADER = env.proxy_ssl_header("DJANGO_SECURE_PROXY_SSL_HEADER")
SECURE_SSL_REDIRECT = env.flag("DJANGO_SECURE_SSL_REDIRECT", default=not DEBUG)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env.flag("DJANGO_SECURE_COOKIES", default=not DEBUG)
# HSTS is remembered by browsers for its whole duration, so it is opt-in.
SECURE_HSTS_SECONDS = env.seconds("DJANGO_SECURE_HSTS_SECONDS", default=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.flag("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", default=False)
SECURE_HSTS_PRELOAD = env.flag("DJANGO_SECURE_HSTS_PRELOAD", default=False)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "distsched_app",
    "examples.demo",
]
if django.VERSION < (6, 0):
    INSTALLED_APPS.insert(0, "django_tasks")  # the django.tasks backport (its checks and signals)

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "scheduler_project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "scheduler_project.wsgi.application"
ASGI_APPLICATION = "scheduler_project.asgi.application"


def database_from_url(url: str) -> dict:
    """Build the DATABASES entry, with the SQLite tuning every process needs."""
    db: dict[str, Any] = dict(dj_database_url.parse(url, conn_max_age=0))
    if db["ENGINE"] == "django.db.backends.sqlite3":
        db["OPTIONS"] = {
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
        # A file, not :memory:, so that real worker processes in the
        # concurrency tests can share the test database.
        name = Path(db["NAME"])
        db["TEST"] = {"NAME": str(name.with_name(f"test_{name.name}"))}
    return db


try:
    DATABASES = {"default": database_from_url(env.raw("DATABASE_URL") or f"sqlite:///{BASE_DIR / 'scheduler.sqlite3'}")}
except ValueError as exc:  # dj-database-url's message names the unsupported scheme
    raise ImproperlyConfigured(f"DATABASE_URL: {exc}") from exc

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "rest_framework.authentication.TokenAuthentication",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "distsched API",
    "DESCRIPTION": "Durable, lease-based job scheduler.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Runs, workflows and bulk actions each have a "state": one enum name per choice set.
    "ENUM_NAME_OVERRIDES": {
        "RunStateEnum": "distsched_app.models.RunState",
        "WorkflowStateEnum": "distsched_app.workflow_models.WorkflowState",
        "BulkActionStateEnum": "distsched_app.bulk_models.BulkState",
    },
}

DISTSCHED: dict[str, Any] = {}

# Django's task framework: @task functions' .enqueue() writes distsched runs (docs/reference/django-tasks.md).
TASKS = {
    "default": {
        "BACKEND": "distsched_app.backends.DistschedBackend",
        "QUEUES": ["default", "emails", "reports"],
        "OPTIONS": {"MAX_ATTEMPTS": 3, "RETRY_BASE_SECONDS": 10, "RETRY_MAX_SECONDS": 3600},
    }
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "distsched": {"()": "distsched_app.logutils.DistschedFormatter"},
    },
    "handlers": {
        "distsched_console": {
            "class": "logging.StreamHandler",
            "formatter": "distsched",
        },
    },
    "loggers": {
        "distsched": {
            "handlers": ["distsched_console"],
            "level": env.log_level("DISTSCHED_LOG_LEVEL", default="INFO"),
            "propagate": False,
        },
    },
}
