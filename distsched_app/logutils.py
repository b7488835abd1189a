"""Log formatting for the ``distsched`` logger: key=value text or JSON lines.

Fields travel in ``extra={"distsched": {...}}``; ``DISTSCHED["LOG_FORMAT"]``
("text" or "json") picks the output at format time, so it follows settings
overrides without reconfiguring logging.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from typing import Any


def _quote(value: Any) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' "=\n\t'):
        return json.dumps(text)
    return text


class KeyValueFormatter(logging.Formatter):
    """``2026-12-01T05:00:00.123Z INFO run finished worker_id=w1 run_id=7 state=succeeded``"""

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(timespec="milliseconds")
        fields = getattr(record, "distsched", {}) or {}
        parts = [stamp.replace("+00:00", "Z"), record.levelname, record.getMessage()]
        parts += [f"{k}={_quote(v)}" for k, v in fields.items()]
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg and the distsched fields."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        data.update(getattr(record, "distsched", {}) or {})
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


class DistschedFormatter(logging.Formatter):
    """Delegates to the text or JSON formatter according to LOG_FORMAT."""

    _text = KeyValueFormatter()
    _json = JsonFormatter()

    def format(self, record: logging.LogRecord) -> str:
        from .conf import conf

        try:
            fmt = conf.LOG_FORMAT
        except Exception:  # noqa: BLE001 - settings not configured: plain text
            fmt = "text"
        return (self._json if fmt == "json" else self._text).format(record)
