"""The one place that makes text storable on both databases (and printable anywhere).

Two kinds of character cannot be stored:

* NUL (``U+0000``): PostgreSQL's ``text`` and ``jsonb`` refuse it;
* lone surrogates (``U+D800``-``U+DFFF``): UTF-8 cannot encode them, so psycopg
  and sqlite3 fail to bind them (``UnicodeEncodeError``, not a database error),
  jsonb refuses their ``\\u`` escapes, and SQLite stores the escapes in JSON
  columns, where every later read that renders them as UTF-8 fails.

Python makes both easily: ``os.fsdecode()`` of undecodable bytes gives
surrogates, ``json.loads('"\\ud800"')`` gives one, C strings carry NUL.

The rule, applied here and nowhere else:

* **inbound** data (names, payloads and their keys, worker ids, filters) is
  *refused*: ``unstorable()`` names the first bad character so the caller
  raises its typed error before anything is written;
* **outbound** text (exception messages and tracebacks, task results, event
  messages, log fields, rendered rows written before this rule existed) is
  *escaped*: ``storable()`` writes each bad character as its Python escape
  (``\\x00``, ``\\udc80``), so nothing is lost and nothing can fail.
"""

from __future__ import annotations

import json
import re
from typing import Any

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# A JSON "\u0000" escape that is not itself an escaped backslash followed by "u0000".
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return "\\x00" if code == 0 else f"\\u{code:04x}"


def unstorable(text: str) -> str | None:
    """What makes ``text`` unstorable ("a NUL character (\\u0000)"), or None if it is fine."""
    match = _UNSTORABLE.search(text)
    if match is None:
        return None
    code = ord(match.group())
    what = "a NUL character" if code == 0 else "a lone surrogate"
    return f"{what} (\\u{code:04x}) at position {match.start()}"


def unstorable_in(value: Any) -> str | None:
    """The first unstorable string or key anywhere in decoded JSON, described; None if all are fine.

    Iterative, so a deep value cannot overflow the stack while being checked.
    """
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            problem = unstorable(item)
            if problem is not None:
                return problem
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return None


def storable(text: str, limit: int | None = None, *, keep_tail: bool = False) -> str:
    """``text`` with NUL and lone surrogates escaped, cut to ``limit`` characters.

    ``keep_tail`` keeps the head and the tail around a marker (a traceback's
    raise is at its end); otherwise the head is kept.
    """
    if not isinstance(text, str):
        text = str(text)
    if _UNSTORABLE.search(text) is not None:
        text = _UNSTORABLE.sub(_escape, text)
    if limit is None or len(text) <= limit:
        return text
    if not keep_tail:
        return text[:limit]
    widest = len(f"\n... [{len(text)} characters truncated] ...\n")  # the marker can only be shorter
    half = (limit - widest) // 2
    if half <= 0:
        return text[:limit]
    return f"{text[:half]}\n... [{len(text) - 2 * half} characters truncated] ...\n{text[-half:]}"


def clean_json(value: Any) -> Any:
    """Decoded JSON with every string and key made storable (a copy; the input is not changed).

    For rendering rows that already hold such text and for task results.
    """
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, dict):
        return {storable(k) if isinstance(k, str) else k: clean_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_json(v) for v in value]
    return value


def nesting_exceeds(value: Any, limit: int) -> bool:
    """Whether decoded JSON is nested deeper than ``limit`` levels (iterative: a deep value
    cannot overflow the stack while it is measured)."""
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if level > limit:
            return True
        if isinstance(item, dict):
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list | tuple):
            stack.extend((v, level + 1) for v in item)
    return False


# Deeper than any value distsched accepts (``MAX_PAYLOAD_DEPTH`` is at most 100) and far below
# what decoding, rendering or serialising can handle anywhere (about a thousand levels).
MAX_DECODED_DEPTH = 200


class UndecodableJSON(dict):
    """Stands in for a stored JSON value nested too deeply to decode or render safely (a row
    written by hand, by a bug, or under an older, looser limit): ``{"undecodable": why}``.

    Every adapter renders it like any object, so one such row cannot break a list for everyone;
    a worker that claims a run holding one marks the run dead without calling its task.
    """

    def __init__(self, text: str) -> None:
        why = f"stored JSON nested deeper than {MAX_DECODED_DEPTH} levels ({len(text)} characters)"
        super().__init__(undecodable=why)

    @property
    def reason(self) -> str:
        return str(self["undecodable"])


# A JSON escape of NUL or of a surrogate: all a JSON text needs to decode to unstorable text.
_JSON_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F][0-9a-fA-F]{2})")


class StorableJSONDecoder(json.JSONDecoder):
    """The decoder of distsched's JSON columns: rows written before the storable-text rule
    (SQLite keeps ``\\ud800`` escapes in JSON text) come out escaped, so no adapter that
    renders them as UTF-8 (API, admin, CLI) can fail. A value nested deeper than
    ``MAX_DECODED_DEPTH`` comes out as ``UndecodableJSON``. Plain rows pay one regex search
    and two counts of brackets."""

    def decode(self, s: str, *args: Any, **kwargs: Any) -> Any:
        if s.count("[") + s.count("{") > MAX_DECODED_DEPTH:  # only then can it be too deep
            try:
                value = super().decode(s, *args, **kwargs)
            except RecursionError:
                return UndecodableJSON(s)
            if nesting_exceeds(value, MAX_DECODED_DEPTH):
                return UndecodableJSON(s)
        else:
            value = super().decode(s, *args, **kwargs)
        if _JSON_ESCAPE.search(s) is not None and unstorable_in(value) is not None:
            return clean_json(value)
        return value


REPR_CHARS = 1000


def _repr(value: Any) -> str:
    try:
        return storable(repr(value), REPR_CHARS)
    except Exception:  # noqa: BLE001 - a hostile __repr__ must not break the caller
        try:
            name = type(value).__name__
        except Exception:  # noqa: BLE001
            name = "object"
        return f"<unrepresentable {storable(name)}>"


def storable_json(value: Any, *, max_bytes: int) -> Any:
    """A task's return value as JSON that both databases store; never raises.

    Plain JSON comes back decoded (so the write cannot fail on the task's own
    objects). A value that JSON cannot hold (NaN, a set, an object, a cycle),
    whose serialisation raises, or that holds unstorable text is stored as
    ``{"repr": <its bounded, escaped repr>}``; one larger than ``max_bytes``
    as ``{"truncated": <the first 1000 characters of its encoding>}``.
    """
    if value is None:
        return None
    try:
        encoded = json.dumps(value, allow_nan=False, ensure_ascii=False)
    except Exception:  # noqa: BLE001 - a hostile return value must not break the worker
        return {"repr": _repr(value)}
    # Raw surrogates survive ensure_ascii=False; NUL is always written as an escape.
    if _UNSTORABLE.search(encoded) is not None or _JSON_NUL.search(encoded) is not None:
        return {"repr": _repr(value)}
    if len(encoded.encode()) > max_bytes:
        return {"truncated": encoded[:REPR_CHARS]}
    return json.loads(encoded)
