"""``scheduler_project/settings.py`` evaluated afresh under a controlled environment (no Django start-up)."""

from __future__ import annotations

import os
import runpy

import pytest
from django.core.exceptions import ImproperlyConfigured

from tests.deployment.docenv import ROOT, documented_environment

SETTINGS = ROOT / "scheduler_project" / "settings.py"
LOCAL_HOSTS = ["localhost", "127.0.0.1", "[::1]"]


@pytest.fixture
def project_settings(monkeypatch):
    """``project_settings(VAR=value, ...)``: the settings module's values with only those variables set."""

    def load(**variables: str) -> dict:
        for name in list(os.environ):
            if name.startswith(("DJANGO_", "DATABASE_URL", "DISTSCHED_")):
                monkeypatch.delenv(name)
        for name, value in variables.items():
            monkeypatch.setenv(name, value)
        return runpy.run_path(str(SETTINGS))

    return load


def test_debug_is_off_by_default_and_on_only_with_DJANGO_DEBUG_1(project_settings):
    assert project_settings()["DEBUG"] is False
    assert project_settings(DJANGO_DEBUG="")["DEBUG"] is False
    assert project_settings(DJANGO_DEBUG="0")["DEBUG"] is False
    assert project_settings(DJANGO_DEBUG="1")["DEBUG"] is True


def test_without_debug_the_defaults_are_those_of_production(project_settings):
    s = project_settings()
    assert s["SECRET_KEY"] == ""  # the web entry points refuse to start; workers do not need it
    assert s["ALLOWED_HOSTS"] == LOCAL_HOSTS
    assert s["CSRF_TRUSTED_ORIGINS"] == []
    assert s["SECURE_SSL_REDIRECT"] is True
    assert s["SESSION_COOKIE_SECURE"] is True and s["CSRF_COOKIE_SECURE"] is True
    assert s["SECURE_PROXY_SSL_HEADER"] is None  # trusting a header nobody strips would let clients fake HTTPS
    assert s["SECURE_HSTS_SECONDS"] == 0  # browsers remember HSTS: opt-in
    assert s["SECURE_HSTS_INCLUDE_SUBDOMAINS"] is False and s["SECURE_HSTS_PRELOAD"] is False


def test_debug_keeps_plain_http_working_with_a_development_key(project_settings):
    s = project_settings(DJANGO_DEBUG="1")
    assert s["SECRET_KEY"] == s["DEVELOPMENT_SECRET_KEY"]
    assert s["SECRET_KEY"].startswith("django-insecure-")  # check --deploy flags this prefix
    assert s["SECURE_SSL_REDIRECT"] is False
    assert s["SESSION_COOKIE_SECURE"] is False and s["CSRF_COOKIE_SECURE"] is False
    assert s["ALLOWED_HOSTS"] == LOCAL_HOSTS


def test_a_secret_key_from_the_environment_is_used_with_and_without_debug(project_settings):
    assert project_settings(DJANGO_SECRET_KEY="k" * 60)["SECRET_KEY"] == "k" * 60
    assert project_settings(DJANGO_SECRET_KEY="k" * 60, DJANGO_DEBUG="1")["SECRET_KEY"] == "k" * 60


def test_the_documented_environment_sets_every_https_setting(project_settings):
    variables = documented_environment()
    s = project_settings(**variables)
    assert s["DEBUG"] is False
    assert s["SECRET_KEY"] == variables["DJANGO_SECRET_KEY"]
    assert s["ALLOWED_HOSTS"] == ["scheduler.example.com"]
    assert s["CSRF_TRUSTED_ORIGINS"] == ["https://scheduler.example.com"]
    assert s["SECURE_PROXY_SSL_HEADER"] == ("HTTP_X_FORWARDED_PROTO", "https")
    assert s["SECURE_SSL_REDIRECT"] is True
    assert s["SESSION_COOKIE_SECURE"] is True and s["CSRF_COOKIE_SECURE"] is True
    assert (s["SECURE_HSTS_SECONDS"], s["SECURE_HSTS_INCLUDE_SUBDOMAINS"], s["SECURE_HSTS_PRELOAD"]) == (
        31536000,
        True,
        True,
    )
    assert s["DATABASES"]["default"]["ENGINE"] == "django.db.backends.postgresql"


def test_each_flag_can_be_turned_off(project_settings):
    s = project_settings(DJANGO_SECURE_SSL_REDIRECT="0", DJANGO_SECURE_COOKIES="0")
    assert s["SECURE_SSL_REDIRECT"] is False
    assert s["SESSION_COOKIE_SECURE"] is False and s["CSRF_COOKIE_SECURE"] is False


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("DJANGO_DEBUG", "true", "DJANGO_DEBUG must be 0 or 1, not 'true'"),
        ("DJANGO_ALLOWED_HOSTS", "https://scheduler.example.com", "DJANGO_ALLOWED_HOSTS takes host names like"),
        ("DJANGO_CSRF_TRUSTED_ORIGINS", "scheduler.example.com", "DJANGO_CSRF_TRUSTED_ORIGINS takes origins like"),
        ("DJANGO_SECURE_PROXY_SSL_HEADER", "X-Forwarded-Proto: https", "DJANGO_SECURE_PROXY_SSL_HEADER takes a header"),
        ("DJANGO_SECURE_SSL_REDIRECT", "yes", "DJANGO_SECURE_SSL_REDIRECT must be 0 or 1, not 'yes'"),
        ("DJANGO_SECURE_COOKIES", "on", "DJANGO_SECURE_COOKIES must be 0 or 1, not 'on'"),
        ("DJANGO_SECURE_HSTS_SECONDS", "1y", "DJANGO_SECURE_HSTS_SECONDS must be a whole number of seconds, not '1y'"),
        ("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", "True", "DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS must be 0 or 1"),
        ("DJANGO_SECURE_HSTS_PRELOAD", "2", "DJANGO_SECURE_HSTS_PRELOAD must be 0 or 1, not '2'"),
        ("DATABASE_URL", "mongodb://db.internal/x", "DATABASE_URL: Scheme 'mongodb://' is unknown"),
        ("DISTSCHED_LOG_LEVEL", "LOUD", "DISTSCHED_LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
    ],
)
def test_a_malformed_variable_is_a_one_line_error_not_a_default(project_settings, name, value, message):
    with pytest.raises(ImproperlyConfigured) as caught:
        project_settings(**{name: value})
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)
