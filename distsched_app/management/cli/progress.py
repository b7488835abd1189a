"""Feedback on long verbs: a progress bar with rate and ETA on a terminal, a clean stop on Ctrl-C.

The bar (tqdm) is drawn on the command's stderr only when stderr is a terminal
and the verb is not asked for ``--json``: a pipe, a log file or cron's mail get
the verb's one summary line and nothing else. Ctrl-C ends the verb with
``Interrupted``: the command prints what was done, like a result, and exits 130
(128 + SIGINT, what a shell reports for a process stopped by Ctrl-C), with no traceback.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import OutputWrapper
from tqdm import tqdm

INTERRUPTED_STATUS = 130


class Interrupted(Exception):
    """A verb stopped by Ctrl-C; ``document`` and ``text`` say what it had done."""

    def __init__(self, document: Any, text: str) -> None:
        super().__init__(text)
        self.document = document
        self.text = text


def on_terminal(stream: Any) -> bool:
    """Whether ``stream`` is a terminal (False for a closed or fileless stream)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class _Raw:
    """A command's ``OutputWrapper`` as tqdm needs it: no line ending added, no error colour."""

    def __init__(self, out: OutputWrapper) -> None:
        self._out = out

    def write(self, text: str) -> None:
        self._out.write(text, style_func=str, ending="")

    def flush(self) -> None:
        self._out.flush()

    def __getattr__(self, name: str) -> Any:  # fileno, encoding: tqdm sizes the bar with them
        return getattr(self._out, name)


class ProgressBar:
    """``update(done, total)`` as work goes; ``close()`` at the end, however it ends.

    The bar appears at the first update with something to do, so a verb that
    finds nothing draws nothing. ``total`` may be an estimate: the bar follows it.
    """

    def __init__(self, stream: OutputWrapper, *, desc: str, unit: str) -> None:
        self._stream = _Raw(stream)
        self._desc = desc
        self._unit = unit
        self._bar: tqdm | None = None

    def update(self, done: int, total: int, postfix: str = "") -> None:
        if self._bar is None:
            if total <= 0:
                return
            self._bar = tqdm(total=total, desc=self._desc, unit=self._unit, file=self._stream, dynamic_ncols=True)
        if max(total, done) != self._bar.total:  # more done than counted: finished since the count
            self._bar.total = max(total, done)
        if postfix:
            self._bar.set_postfix_str(postfix, refresh=False)  # drawn by the update, at tqdm's pace
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def progress_bar(stream: OutputWrapper | None, *, desc: str, unit: str) -> ProgressBar | None:
    """A bar on ``stream`` if it is a terminal; None otherwise (or without a stream: ``--json``)."""
    if stream is None or not on_terminal(stream):
        return None
    return ProgressBar(stream, desc=desc, unit=unit)
