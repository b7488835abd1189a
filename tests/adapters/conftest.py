"""Fixtures for the REST API tests: users with and without rights, token clients, the API's clock.

Here rather than in ``api/`` because ``test_hostile_entry_points.py`` (every
entry point at once) calls the API with them too. Nothing here is autouse, so
the other adapter tests (``admin/``, ``cli/``, ``metrics/``) are unaffected.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient


@pytest.fixture
def api_clock(clock):
    """The API reads this FakeClock (the ``clock`` fixture installs it for every adapter)."""
    return clock


def _user(django_user_model, username: str, *, staff: bool = False, superuser: bool = False, perms=()):
    user = django_user_model.objects.create_user(
        username=username, password="pw-" + username, is_staff=staff or superuser, is_superuser=superuser
    )
    if perms:
        user.user_permissions.add(
            *Permission.objects.filter(content_type__app_label="distsched_app", codename__in=perms)
        )
    return user


@pytest.fixture
def make_api_user(db, django_user_model):
    """``make_api_user("ann", staff=True, perms=["change_run"])``."""

    def make(username: str, **options):
        return _user(django_user_model, username, **options)

    return make


@pytest.fixture
def token_client():
    """An APIClient authenticating as ``user`` with a real token header."""

    def make(user=None) -> APIClient:
        client = APIClient()
        client.default_format = "json"  # the API parses JSON only
        if user is not None:
            token, _ = Token.objects.get_or_create(user=user)
            client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
        return client

    return make


OPERATOR_PERMS = [
    "view_schedule",
    "add_schedule",
    "change_schedule",
    "delete_schedule",
    "view_run",
    "add_run",
    "change_run",
    "view_worker",
    "view_queuepause",
    "change_queuepause",
    "view_limit",
    "change_limit",
    "view_workflow",
    "add_workflow",
    "change_workflow",
]


@pytest.fixture
def operator(make_api_user):
    """Staff who may do everything the API offers: read, create (schedules, enqueued runs), change, act on
    and delete."""
    return make_api_user("operator", staff=True, perms=OPERATOR_PERMS)


@pytest.fixture
def api(api_clock, operator, token_client) -> APIClient:
    """The usual client: an operator allowed to read and write, on the fake clock."""
    return token_client(operator)


@pytest.fixture
def wsgi_in_test_transaction():
    """Let a real WSGI handler serve requests inside the test's transaction.

    Django's test client disconnects these handlers for the same reason: at the
    start and end of each request they would close the connection, rolling the
    test's data back.
    """
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)
