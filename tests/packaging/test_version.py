"""One version number: ``distsched_app.__version__``, which the package metadata and the changelog follow."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import distsched_app

ROOT = Path(__file__).resolve().parents[2]


def test_the_package_metadata_reads_the_version_from_the_app():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"], "the version is written once, in distsched_app/__init__.py"
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "distsched_app.__version__"}


def test_the_version_is_a_release_the_changelog_lists():
    assert re.fullmatch(r"\d+\.\d+\.\d+", distsched_app.__version__)
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in changelog
    assert f"## [{distsched_app.__version__}] - " in changelog
