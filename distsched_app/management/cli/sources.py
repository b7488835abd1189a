"""Where ``schedule apply --file`` and ``import celery-beat --from`` read a dict: a JSON file, or a
Python object named ``module:ATTR`` (imported: the operator names code of their own project)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from ...errors import ValidationError


def load(spec: str, *, option: str) -> Any:
    """The object ``spec`` names; ``ValidationError`` (one line, naming ``option``) otherwise."""
    if spec.endswith(".json") or Path(spec).is_file():
        try:
            return json.loads(Path(spec).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ValidationError(f"{option}: cannot read {spec}: {exc.strerror or exc}") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValidationError(f"{option}: {spec} is not valid JSON: {exc}") from None
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValidationError(
            f"{option}: give a .json file or module:ATTR (e.g. proj.celery:beat_schedule), not {spec!r}"
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure of the user's module is their error, said in one line
        raise ValidationError(f"{option}: cannot import {module_name}: {type(exc).__name__}: {exc}") from None
    value: Any = module
    for part in attr.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise ValidationError(f"{option}: {module_name} has no attribute {attr!r}") from None
    return value
