"""Test settings: the project's, plus a test app that registers test tasks."""

from scheduler_project.settings import *  # noqa: F403
from scheduler_project.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
DISTSCHED = {}
