"""Reference pages generated from the code at build time, so that they are never written twice.

At ``builder-inited`` this writes Markdown into ``docs/_generated/`` (git-ignored),
which the reference pages pull in with MyST's ``{include}``:

- ``cli-<command>.md``: every argument of ``runworker``, ``tick`` and ``distsched``
  (all its groups and verbs), from the commands' own argparse parsers;
- ``rest.md``: every REST operation and schema, from the OpenAPI document that
  drf-spectacular generates (also copied as ``openapi.json`` next to the site);
- ``metrics.md``: every metric family ``/metrics`` serves, its type, labels and
  help text, from the collector itself.

It reads code only: no database, no network.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx

COMMANDS = ["runworker", "tick", "distsched"]
# Django's own options on every command: listed once on the page, not per command.
DJANGO_BASE_DESTS = {"help", "version", "verbosity", "settings", "pythonpath", "traceback", "no_color"}
DJANGO_BASE_DESTS |= {"force_color", "skip_checks"}


def cell(text: object) -> str:
    """One Markdown table cell: a single line, pipes escaped."""
    return prose(" ".join(str(text).split())).replace("|", "\\|")


def prose(text: str) -> str:
    """Text from the code as Markdown: ``<id>`` outside code spans stays text, not an HTML tag."""
    parts = text.split("`")
    return "`".join(part if i % 2 else part.replace("<", "&lt;") for i, part in enumerate(parts))


# ------------------------------------------------------------------ commands


def command_parser(name: str) -> argparse.ArgumentParser:
    from django.core.management import load_command_class

    return load_command_class("distsched_app", name).create_parser("manage.py", name)


def own_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.dest not in DJANGO_BASE_DESTS and a.help != argparse.SUPPRESS]


def usage(parser: argparse.ArgumentParser) -> str:
    formatter = parser._get_formatter()
    formatter.add_usage(parser.usage, own_actions(parser), parser._mutually_exclusive_groups, prefix="")
    return formatter.format_help().strip()


def argument_rows(parser: argparse.ArgumentParser) -> Iterator[str]:
    formatter = parser._get_formatter()
    exclusive = {id(a): g for g in parser._mutually_exclusive_groups for a in g._group_actions}
    for action in own_actions(parser):
        if isinstance(action, argparse._SubParsersAction):
            continue
        if action.option_strings:
            metavar = "" if action.nargs == 0 else " " + formatter._format_args(action, action.dest.upper())
            name = ", ".join(f"`{option}{metavar}`" for option in action.option_strings)
        else:
            name = f"`{formatter._format_args(action, action.dest)}`"
        text = formatter._expand_help(action) if action.help else ""
        notes = []
        if action.option_strings and action.required:
            notes.append("required")
        group = exclusive.get(id(action))
        if group is not None:
            others = [a.option_strings[0] for a in group._group_actions if a is not action and a.option_strings]
            notes.append(("or " if group.required else "not with ") + ", ".join(f"`{o}`" for o in others))
        if isinstance(action, argparse._AppendAction) and "repeatable" not in text:
            notes.append("repeatable")
        if action.choices and action.metavar and not isinstance(action.choices, dict):
            notes.append("one of " + ", ".join(f"`{c}`" for c in action.choices))
        default = action.default
        if default not in (None, False, argparse.SUPPRESS, [], "") and "default" not in text.lower():
            notes.append(f"default `{default}`")
        if notes:
            text = f"{text} ({'; '.join(notes)})" if text else "; ".join(notes)
        yield f"| {name} | {cell(text)} |"


def command_markdown(parser: argparse.ArgumentParser, title: str, level: int) -> Iterator[str]:
    subparsers = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    yield f"{'#' * level} `{title}`"
    yield ""
    text = parser.description or ""
    if text:
        yield prose(text.strip())
        yield ""
    yield "```text"
    yield usage(parser)
    yield "```"
    yield ""
    rows = list(argument_rows(parser))
    if rows:
        yield "| argument | meaning |"
        yield "|---|---|"
        yield from rows
        yield ""
    if subparsers is not None:
        helps = {choice.dest: choice.help for choice in subparsers._choices_actions}
        for name, child in subparsers.choices.items():
            if not child.description and helps.get(name):
                child.description = helps[name]
            yield from command_markdown(child, f"{title} {name}", min(level + 1, 5))


def write_commands(out: Path) -> None:
    for name in COMMANDS:
        lines = list(command_markdown(command_parser(name), name, 3))  # under the page's "Argument reference"
        (out / f"cli-{name}.md").write_text("\n".join(lines) + "\n")


# ------------------------------------------------------------------ REST


def openapi_document() -> dict[str, Any]:
    from drf_spectacular.generators import SchemaGenerator
    from drf_spectacular.renderers import OpenApiJsonRenderer

    schema = SchemaGenerator().get_schema(request=None, public=True)
    return json.loads(OpenApiJsonRenderer().render(schema, renderer_context={}))


TAG_ORDER = ["schedules", "runs", "queues", "limits", "workers", "stats"]  # the page's order, then the rest


def schema_label(name: str) -> str:
    return f"rest-schema-{name.lower()}"


def type_of(schema: dict[str, Any] | bool) -> str:
    if not isinstance(schema, dict):
        return "any"
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"{{ref}}`{name} <{schema_label(name)}>`"
    for combinator, word in (("oneOf", " or "), ("anyOf", " or "), ("allOf", " and ")):
        if combinator in schema:
            text = word.join(type_of(s) for s in schema[combinator])
            return text + (", nullable" if schema.get("nullable") else "")
    kind = schema.get("type", "any")
    if kind == "array":
        text = f"array of {type_of(schema.get('items', {}))}"
    elif kind == "object" and "additionalProperties" in schema and schema["additionalProperties"] not in (True, {}):
        text = f"object of {type_of(schema['additionalProperties'])}"
    else:
        text = str(kind) + (f" ({schema['format']})" if "format" in schema else "")
    if "enum" in schema:
        text += ": " + ", ".join(f"`{v}`" for v in schema["enum"] if v not in (None, ""))
    if schema.get("nullable"):
        text += ", nullable"
    return text


def body_type(content: dict[str, Any]) -> str:
    return "; ".join(f"{type_of(media.get('schema', {}))} (`{kind}`)" for kind, media in content.items())


def operation_markdown(method: str, path: str, op: dict[str, Any]) -> Iterator[str]:
    yield f"### `{method.upper()} {path}`"
    yield ""
    for key in ("summary", "description"):
        if op.get(key):
            yield prose(op[key].strip())
            yield ""
    parameters = op.get("parameters", [])
    if parameters:
        yield "| parameter | in | type | required | description |"
        yield "|---|---|---|---|---|"
        for p in parameters:
            required = "yes" if p.get("required") else "no"
            row = [f"`{p['name']}`", p["in"], type_of(p.get("schema", {})), required, p.get("description", "")]
            yield "| " + " | ".join(cell(v) for v in row) + " |"
        yield ""
    body = op.get("requestBody")
    if body:
        required = " (required)" if body.get("required") else ""
        yield f"Request body{required}: {body_type(body.get('content', {}))}"
        yield ""
    yield "| status | body | description |"
    yield "|---|---|---|"
    for status, response in op.get("responses", {}).items():
        content = body_type(response["content"]) if response.get("content") else "-"
        yield f"| {status} | {cell(content)} | {cell(response.get('description', ''))} |"
    yield ""


def schema_markdown(name: str, schema: dict[str, Any]) -> Iterator[str]:
    yield f"({schema_label(name)})="
    yield f"### {name}"
    yield ""
    if schema.get("description"):
        yield prose(schema["description"].strip())
        yield ""
    properties = schema.get("properties")
    if not properties:
        yield type_of(schema)
        yield ""
        return
    required = set(schema.get("required", []))
    yield "| field | type | required | description |"
    yield "|---|---|---|---|"
    for field, spec in properties.items():
        flags = ["yes" if field in required else "no"]
        if spec.get("readOnly"):
            flags.append("read-only")
        if spec.get("writeOnly"):
            flags.append("write-only")
        row = [f"`{field}`", type_of(spec), ", ".join(flags), spec.get("description", "")]
        yield "| " + " | ".join(cell(v) for v in row) + " |"
    yield ""


def write_rest(out: Path, extra: Path) -> None:
    document = openapi_document()
    (extra / "openapi.json").write_text(json.dumps(document, indent=2, sort_keys=False) + "\n")
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {tag: [] for tag in TAG_ORDER}
    for path, item in document["paths"].items():
        for method, op in item.items():
            if method in {"get", "post", "put", "patch", "delete"}:
                by_tag.setdefault((op.get("tags") or ["other"])[0], []).append((method, path, op))
    lines = [f"OpenAPI {document['openapi']}, *{document['info']['title']}* {document['info'].get('version', '')}.", ""]
    lines += ["## Operations", ""]
    for tag, operations in by_tag.items():
        if not operations:
            continue
        lines += [f"### {tag.capitalize()} endpoints", ""]
        for method, path, op in operations:
            lines += [line.replace("### `", "#### `", 1) for line in operation_markdown(method, path, op)]
    lines += ["## Schemas", ""]
    for name, schema in document.get("components", {}).get("schemas", {}).items():
        lines += list(schema_markdown(name, schema))
    (out / "rest.md").write_text("\n".join(lines) + "\n")


# ------------------------------------------------------------------ metrics


def metric_families() -> list[Any]:
    from distsched_app.metrics import families, limit_families, workflow_family
    from distsched_app.models import Liveness
    from distsched_app.services.stats import TIMINGS, Snapshot

    empty = Snapshot(
        now=datetime(2026, 1, 1, tzinfo=UTC),
        runs={},
        oldest_waiting={},
        events={},
        recent_events={},
        timings={name: {} for name in TIMINGS},
        workers=dict.fromkeys(Liveness.values, 0),
        live_workers=[],
        schedules_total=0,
        schedules_paused=0,
        schedules_overdue=0,
        oldest_overdue=None,
    )
    return [*families(empty), *limit_families([]), workflow_family({})]


def write_metrics(out: Path) -> None:
    suffixes = {"counter": "_total", "gaugehistogram": "_bucket, _gcount, _gsum"}
    lines = ["| metric | type | labels | help |", "|---|---|---|---|"]
    for family in metric_families():
        name = family.name + ("_total" if family.type == "counter" else "")
        kind = family.type if family.type != "gaugehistogram" else f"gauge histogram ({suffixes[family.type]})"
        labels = ", ".join(f"`{label}`" for label in getattr(family, "_labelnames", ())) or "-"
        lines.append(f"| `{name}` | {kind} | {labels} | {cell(family.documentation)} |")
    (out / "metrics.md").write_text("\n".join(lines) + "\n")


# ------------------------------------------------------------------ Sphinx


def generate(app: Sphinx) -> None:
    out = Path(app.srcdir) / "_generated"
    extra = out / "extra"
    extra.mkdir(parents=True, exist_ok=True)
    write_commands(out)
    write_rest(out, extra)
    write_metrics(out)


def setup(app: Sphinx) -> dict[str, Any]:
    # config-inited: before html_extra_path is checked and before any source is read.
    app.connect("config-inited", lambda app, config: generate(app))
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
