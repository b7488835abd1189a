"""Sphinx configuration of distsched's documentation site (``make docs``).

The sources are the Markdown files under ``docs/`` (MyST). The reference pages
that describe code are generated from it at build time: the Python API from
docstrings (autodoc), the commands from their argparse parsers, the REST API
from the OpenAPI schema drf-spectacular generates, and the metrics from the
collector (``docs/_ext/distsched_docs.py``, into the git-ignored ``docs/_generated``).
``make docs`` builds with ``-W --keep-going -n``: any warning (a broken link or
reference, a page outside every table of contents) fails the build.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path[:0] = [str(ROOT), str(DOCS / "_ext")]

# autodoc imports the app's modules, which need configured settings. The
# ready-to-run project's settings, without a database being touched.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings")

import django  # noqa: E402

django.setup()

import distsched_app  # noqa: E402

project = "distsched"
author = "the distsched authors"
copyright = "the distsched authors"  # Sphinx's name for it
release = distsched_app.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
    "distsched_docs",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "_generated", "_ext", "**/README.md"]

myst_enable_extensions = ["colon_fence", "deflist"]
# Links such as [x](deployment.md#environment-variables) resolve to the heading's anchor, as on GitHub.
myst_heading_anchors = 4

html_theme = "furo"
html_title = f"distsched {release}"
html_extra_path = ["_generated/extra"]  # openapi.json, the schema the REST reference is made from
html_static_path: list[str] = []

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# Members are listed per directive (docs/reference/python.md): only the public ones.
autodoc_default_options: dict[str, object] = {}

# No network at build time (no intersphinx): names from outside the project are
# not links. Every reference into the project itself must resolve.
nitpick_ignore_regex = [
    (r"py:.*", r"(django|rest_framework|datetime|collections|typing|typing_extensions|zoneinfo|enum|asyncio)\..*"),
    (r"py:.*", r"(Any|Callable|Iterable|Iterator|Mapping|Sequence|Self|datetime|timedelta|tzinfo|ZoneInfo)"),
    (r"py:.*", r"(prometheus_client|logging|json|argparse|concurrent|threading)\..*"),
    (r"py:class", r"(NoneType|Exception|ValueError|TypeError|LookupError)"),
    # Annotations that name the app's internal classes (a service's result, a model that
    # only the admin shows) are not links; the public ones are documented and do link.
    (r"py:class", r"distsched_app\..*"),
    # A dataclass field annotated with a string ('dict[str, int]') is split at its comma by Sphinx.
    (r"py:class", r"'?dict\[str"),
]
