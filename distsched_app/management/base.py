"""Shared plumbing for distsched's commands: one-line errors, typed argument parsers."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ..text import storable, unstorable


class OneLineParser(CommandParser):
    """Argument errors as one line on stderr and exit status 2, never a usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        if self.called_from_command_line:
            sys.stderr.write(f"{self.prog}: error: {message}\n")
            sys.exit(2)
        raise CommandError(f"Error: {message}")


class DistschedCommand(BaseCommand):
    """Subclasses declare options in ``add_command_arguments``."""

    def add_arguments(self, parser: CommandParser) -> None:
        # Swap the class before options (and subparsers, which copy it) are added.
        parser.__class__ = OneLineParser
        self.add_command_arguments(parser)

    def add_command_arguments(self, parser: CommandParser) -> None:
        pass


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
    return value


def seconds_up_to(limit: float) -> Callable[[str], float]:
    """A positive number of seconds, at most ``limit`` (a wait longer than that is a typo)."""

    def parse(text: str) -> float:
        value = positive_float(text)
        if value > limit:
            raise argparse.ArgumentTypeError(f"{text!r} must be at most {limit:g} seconds")
        return value

    return parse


def fraction_up_to(limit: float) -> Callable[[str], float]:
    """A number from 0 to ``limit`` (0 allowed: "none")."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not 0 <= value <= limit:  # NaN fails too
            raise argparse.ArgumentTypeError(f"{text!r} must be between 0 and {limit:g}")
        return value

    return parse


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def int_up_to(limit: int) -> Callable[[str], int]:
    """A whole number from 1 to ``limit``."""

    def parse(text: str) -> int:
        value = positive_int(text)
        if value > limit:
            raise argparse.ArgumentTypeError(f"{text!r} must be at most {limit}")
        return value

    return parse


def storable_text(text: str) -> str:
    """Command-line text the databases can store (an undecodable byte in argv becomes a
    lone surrogate, which no database driver can encode)."""
    problem = unstorable(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{storable(text)!r} contains {problem}")
    return text


def queue_list(text: str) -> list[str]:
    queues = [q.strip() for q in text.split(",") if q.strip()]
    if not queues:
        raise argparse.ArgumentTypeError("give at least one queue name, e.g. --queues default,emails")
    return queues
