"""docs/howto/testing.md: every Python snippet runs as written (pytest-style tests with the
fixtures they name, TestCase classes with unittest's runner)."""

from __future__ import annotations

import inspect
import re
import unittest
from pathlib import Path

import pytest
from django.test import TestCase

from distsched_app import pytest_plugin

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "howto" / "testing.md"


def blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", PAGE.read_text(), re.MULTILINE | re.DOTALL)


def snippet_tests(source: str) -> list[tuple[str, object]]:
    namespace: dict = {"__name__": "testing_howto_snippet"}
    exec(compile(source, str(PAGE), "exec"), namespace)  # noqa: S102 - our own documentation
    found = [(n, v) for n, v in namespace.items() if n.startswith("test_") and callable(v)]
    found += [
        (n, v) for n, v in namespace.items() if isinstance(v, type) and issubclass(v, TestCase) and v is not TestCase
    ]
    return found


# The plugin's fixtures, as a conftest listing it would give them.
distsched_clock = pytest_plugin.distsched_clock
distsched_drain = pytest_plugin.distsched_drain

CASES = [(i, name, test) for i, source in enumerate(blocks()) for name, test in snippet_tests(source)]


def test_the_page_has_the_snippets_this_test_runs():
    assert len(blocks()) == 5
    assert {name for _, name, _ in CASES} == {
        "test_a_receipt_is_emailed",
        "ConvertAmountTests",
        "test_the_webhook_is_retried_then_delivered",
        "HeartbeatTests",
    }
    assert 'pytest_plugins = ["distsched_app.pytest_plugin"]' in [b.strip() for b in blocks()]


@pytest.mark.parametrize(("index", "name", "test"), CASES, ids=[name for _, name, _ in CASES])
def test_snippet(index, name, test, transactional_db, distsched_clock, distsched_drain):
    if isinstance(test, type):
        result = unittest.TextTestRunner(stream=open("/dev/null", "w"), verbosity=0).run(
            unittest.defaultTestLoader.loadTestsFromTestCase(test)
        )
        assert result.wasSuccessful(), result.failures + result.errors
        assert result.testsRun >= 1
        return
    fixtures = {"db": None, "distsched_clock": distsched_clock, "distsched_drain": distsched_drain}
    test(**{p: fixtures[p] for p in inspect.signature(test).parameters})
