"""The project's environment readers accept the documented forms and refuse everything else in one line."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from scheduler_project import env

NAME = "DISTSCHED_TEST_VARIABLE"


@pytest.fixture
def setvar(monkeypatch):
    def set_value(value: str | None) -> None:
        if value is None:
            monkeypatch.delenv(NAME, raising=False)
        else:
            monkeypatch.setenv(NAME, value)

    return set_value


@pytest.mark.parametrize(
    ("value", "expected"), [(None, True), ("", True), ("  ", True), ("1", True), ("0", False), (" 0 ", False)]
)
def test_flag_reads_1_and_0_and_falls_back_when_unset_or_empty(setvar, value, expected):
    setvar(value)
    assert env.flag(NAME, default=True) is expected


@pytest.mark.parametrize("value", ["yes", "true", "on", "False", "01", "2"])
def test_flag_refuses_anything_but_0_and_1(setvar, value):
    setvar(value)
    with pytest.raises(ImproperlyConfigured, match=rf"^{NAME} must be 0 or 1, not '{value}'$"):
        env.flag(NAME, default=False)


def test_seconds(setvar):
    setvar(None)
    assert env.seconds(NAME, default=7) == 7
    setvar("31536000")
    assert env.seconds(NAME, default=0) == 31536000
    for bad in ("1y", "-1", "3.5", "1e6", "\u00b2"):
        setvar(bad)
        with pytest.raises(ImproperlyConfigured, match=rf"^{NAME} must be a whole number of seconds, not "):
            env.seconds(NAME, default=0)


def test_hosts_keep_the_default_only_when_unset(setvar):
    setvar(None)
    assert env.hosts(NAME, default=["localhost"]) == ["localhost"]
    setvar(" scheduler.example.com , .example.org,[::1] ")
    assert env.hosts(NAME, default=["localhost"]) == ["scheduler.example.com", ".example.org", "[::1]"]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("https://scheduler.example.com", "takes host names like scheduler.example.com, not 'https://"),
        ("example.com/admin", "takes host names like"),
        ("a.example.com,,b.example.com", "has an empty item in"),
        ("a.example.com,", "has an empty item in"),
    ],
)
def test_hosts_refuse_urls_and_empty_items(setvar, value, message):
    setvar(value)
    with pytest.raises(ImproperlyConfigured, match=rf"^{NAME} {message}"):
        env.hosts(NAME, default=[])


def test_origins_accept_scheme_host_and_port(setvar):
    setvar(None)
    assert env.origins(NAME) == []
    setvar("https://scheduler.example.com/, http://localhost:8000,https://*.example.org,http://[::1]:8000")
    assert env.origins(NAME) == [
        "https://scheduler.example.com",
        "http://localhost:8000",
        "https://*.example.org",
        "http://[::1]:8000",
    ]


@pytest.mark.parametrize(
    "value",
    [
        "scheduler.example.com",
        "ftp://example.com",
        "https://",
        "https://example.com/admin",
        "https://example.com?x=1",
        "https://example.com:port",
        "https://user@example.com",
        "https://exa mple.com",
    ],
)
def test_origins_refuse_anything_but_an_origin(setvar, value):
    setvar(value)
    with pytest.raises(ImproperlyConfigured, match=rf"^{NAME} takes origins like https://scheduler.example.com, not "):
        env.origins(NAME)


def test_proxy_ssl_header_becomes_djangos_meta_key(setvar):
    setvar(None)
    assert env.proxy_ssl_header(NAME) is None
    setvar("X-Forwarded-Proto")
    assert env.proxy_ssl_header(NAME) == ("HTTP_X_FORWARDED_PROTO", "https")
    for bad in ("X-Forwarded-Proto: https", "HTTP_X_FORWARDED_PROTO", "-x"):
        setvar(bad)
        with pytest.raises(ImproperlyConfigured, match=rf"^{NAME} takes a header name like X-Forwarded-Proto, not "):
            env.proxy_ssl_header(NAME)


def test_log_level(setvar):
    setvar(None)
    assert env.log_level(NAME, default="INFO") == "INFO"
    setvar("warning")
    assert env.log_level(NAME, default="INFO") == "WARNING"
    setvar("LOUD")
    with pytest.raises(ImproperlyConfigured, match=rf"^{NAME} must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, "):
        env.log_level(NAME, default="INFO")
