"""The ``cli`` fixture every ``distsched`` command test uses."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from distsched_app.management.commands.distsched import Command


@pytest.fixture
def cli(clock):
    """Run ``distsched`` with the test clock; returns stdout (and asserts stderr is empty)."""

    def run(*args: str) -> str:
        out, err = StringIO(), StringIO()
        call_command(Command(), *args, stdout=out, stderr=err)
        assert err.getvalue() == ""
        return out.getvalue()

    return run
