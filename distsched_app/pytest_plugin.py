"""pytest fixtures over ``distsched_app.testing``; enable them in your ``conftest.py``::

    pytest_plugins = ["distsched_app.pytest_plugin"]

``distsched_clock``: a ``FakeClock`` installed as the clock everything reads, at
``DISTSCHED_TEST_START`` (2026-01-01T00:00:00Z). ``distsched_drain``: ``drain`` bound to
that clock (it needs the database: use it with pytest-django's ``db`` fixture or
``django_db`` mark, transactional or not).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .clock import FakeClock
from .testing import Drained, drain, fake_clock

DISTSCHED_TEST_START = "2026-01-01T00:00:00+00:00"


@pytest.fixture
def distsched_clock() -> Iterator[FakeClock]:
    with fake_clock(DISTSCHED_TEST_START) as clock:
        yield clock


@pytest.fixture
def distsched_drain(distsched_clock: FakeClock) -> Callable[..., Drained]:
    def run(**options: Any) -> Drained:
        options.setdefault("clock", distsched_clock)
        return drain(**options)

    return run
