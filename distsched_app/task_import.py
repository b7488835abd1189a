"""Finding a framework task declared outside an app's ``tasks`` module, safely.

Django's docs put tasks in ``tasks.py`` by convention, not by rule: a ``@task``
in ``myapp/jobs.py`` is registered when that module is first imported, which a
worker (or another process reading the result) may never do. A stored task name
is then resolved by importing its module, under two conditions that keep stored
data from choosing what runs: the module lies inside an installed app's package,
and the name's attribute there is a framework ``Task`` whose path is that name.
Anything else is never imported, and the name stays unknown.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging

from django.apps import apps

from . import framework
from .registry import TASK_NAME_RE, TaskEntry, TaskRegistry

logger = logging.getLogger("distsched")


def _inside_installed_app(module_name: str) -> bool:
    """Under an installed app's package (distsched's own holds no framework task), in no private or
    migrations module."""
    parts = module_name.split(".")
    if any(p.startswith("_") or p == "migrations" for p in parts) or parts[0] == "distsched_app":
        return False
    return any(module_name == app.name or module_name.startswith(app.name + ".") for app in apps.get_app_configs())


def import_framework_task(name: str, registry: TaskRegistry) -> TaskEntry | None:
    """The registry's entry for ``name``, importing its module first when allowed (see the module
    docstring); None when the name is not a framework task of an installed app."""
    entry = registry.find(name)
    if entry is not None or not framework.AVAILABLE or not TASK_NAME_RE.fullmatch(name):
        return entry
    module_name, _, attribute = name.rpartition(".")
    parts = module_name.split(".")
    if not module_name or not attribute.isidentifier() or not all(p.isidentifier() for p in parts):
        return None
    if not _inside_installed_app(module_name):
        return None
    try:
        if importlib.util.find_spec(module_name) is None:  # no such module: nothing to import
            return None
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - a module that fails to import leaves the task unknown
        logger.warning("could not import %s for task %s: %s", module_name, name, exc)
        return None
    task = getattr(module, attribute, None)
    if not isinstance(task, framework.Task) or task.module_path != name:
        return None
    return registry.find(name) or registry.register_framework_task(task)
