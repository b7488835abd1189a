"""``distsched import celery-beat``: Celery beat's schedules as distsched schedules.

    distsched import celery-beat [--from module:ATTR | --from PATH.json] [--timezone TZ]
                                 [--dry-run | --print-settings] [--json]

Reads ``--from``, else the settings' ``CELERY_BEAT_SCHEDULE`` and django-celery-beat's tables
(when that app is installed). Writes the schedules (``services.celery_beat.import_schedules``:
those that exist are left as they are), or with ``--print-settings`` prints them as a
``DISTSCHED["SCHEDULES"]`` snippet instead. Every entry it could not translate is reported with
why. Exit 1 only when there was nothing to read.
"""

from __future__ import annotations

import pprint
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.conf import settings

from ...errors import ValidationError
from ...services import celery_beat, queues
from . import sources
from .tables import table

Output = tuple[Any, str]


def add_arguments(groups: Any, leaf: Callable[[Any, str, str], Any]) -> None:
    group = groups.add_parser("import", help="Import schedules from another scheduler (Celery beat).")
    verbs = group.add_subparsers(dest="verb", required=True)
    beat = leaf(
        verbs,
        "celery-beat",
        "Create schedules from CELERY_BEAT_SCHEDULE (or --from) and django-celery-beat's tables, "
        "reporting every entry that has no equivalent.",
    )
    beat.add_argument(
        "--from",
        dest="source",
        metavar="module:ATTR|PATH.json",
        help="The beat schedule dict to read, e.g. proj.celery:app.conf.beat_schedule (default: the settings' "
        "CELERY_BEAT_SCHEDULE, and django-celery-beat's periodic tasks when installed).",
    )
    beat.add_argument(
        "--timezone",
        metavar="TZ",
        help="The zone crontabs are read in (default: CELERY_TIMEZONE from the settings, else UTC).",
    )
    mode = beat.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="Say what would be created; write nothing.")
    mode.add_argument(
        "--print-settings",
        action="store_true",
        help="Print a DISTSCHED['SCHEDULES'] snippet instead of writing schedules.",
    )


def _read(o: dict[str, Any], zone: str) -> tuple[list[str], celery_beat.Translation]:
    """The sources read and their translation; ``ValidationError`` when there is nothing to read."""
    if o.get("source"):
        return [o["source"]], celery_beat.translate(sources.load(o["source"], option="--from"), timezone=zone)
    read: list[str] = []
    out = celery_beat.Translation()
    beat = getattr(settings, "CELERY_BEAT_SCHEDULE", None)
    if beat is not None:
        read.append("CELERY_BEAT_SCHEDULE")
        out = celery_beat.translate(beat, timezone=zone)
    rows = celery_beat.django_celery_beat_tasks()
    if rows is not None:
        read.append("django-celery-beat")
        more = celery_beat.translate_periodic_tasks(rows, timezone=zone)
        out.schedules |= more.schedules
        out.notes |= more.notes
        out.skipped |= more.skipped
    if not read:
        raise ValidationError(
            "nothing to import: no CELERY_BEAT_SCHEDULE in the settings, django-celery-beat is not installed, "
            "and no --from"
        )
    return read, out


def import_celery_beat(now: datetime, o: dict[str, Any]) -> Output:
    zone = o.get("timezone") or getattr(settings, "CELERY_TIMEZONE", None) or "UTC"
    read, found = _read(o, zone)
    label = " and ".join(read)
    document: dict[str, Any] = {
        "source": read,
        "schedules": found.schedules,
        "notes": found.notes,
        "skipped": found.skipped,
        "written": None,
    }
    if o.get("print_settings"):
        return document, _snippet(label, found)
    done = celery_beat.import_schedules(
        found.schedules, now=now, actor=queues.cli_actor(), reason=f"imported from {label}", dry_run=o["dry_run"]
    )
    document["written"] = [{"name": d.name, "action": d.action, "message": d.message} for d in done]
    would = "would be " if o["dry_run"] else ""
    rows = [
        (d.name, f"{would}{d.action}" if d.action == "created" else d.action, "; ".join(_what(d, found)) or "-")
        for d in done
    ]
    rows += [(name, "skipped", reason) for name, reason in found.skipped.items()]
    counts = {a: sum(1 for d in done if d.action == a) for a in ("created", "exists", "failed")}
    counts["not translated"] = len(found.skipped)
    summary = ", ".join(f"{n} {a}" for a, n in counts.items() if n) or "no entries"
    head = f"{'dry run, nothing written: ' if o['dry_run'] else ''}{label}: {summary}"
    text = "\n".join([table(("SCHEDULE", "DONE", "WHAT"), rows, max_width=120), "", head]) if rows else head
    return document, text


def _what(done: celery_beat.Imported, found: celery_beat.Translation) -> list[str]:
    spec = found.schedules[done.name]
    when = (
        f"every {spec['interval_seconds']}s"
        if "interval_seconds" in spec
        else f"cron {spec['cron']} ({spec['timezone']})"
        if "cron" in spec
        else f"once at {spec.get('run_at')}"
    )
    if done.action == "failed":
        return [done.message]
    parts = [done.message] if done.message else [f"{when}, task {spec['task']}"]
    return parts + found.notes.get(done.name, [])


def _snippet(label: str, found: celery_beat.Translation) -> str:
    lines = [f"# From {label}: {len(found.schedules)} translated, {len(found.skipped)} not."]
    lines += [f"# {name}: {note}" for name, notes in found.notes.items() for note in notes]
    lines += [f"# not translated: {name}: {reason}" for name, reason in found.skipped.items()]
    body = [
        f"    {name!r}: {pprint.pformat(spec, sort_dicts=False, width=1000)}," for name, spec in found.schedules.items()
    ]
    return "\n".join([*lines, 'DISTSCHED["SCHEDULES"] = {', *body, "}"])


VERBS: dict[str, Callable[[datetime, dict[str, Any]], Output]] = {
    "import celery-beat": import_celery_beat,
}
