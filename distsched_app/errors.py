"""Typed errors of the scheduler core.

Adapters translate them: the API to 400/404/409, commands to a one-line
``CommandError``, the admin to a message. They deliberately carry no Django
or DRF exception types. ``field`` names the input that was wrong, so an
adapter can attach the message to the right form or serializer field.
"""

from __future__ import annotations


class DistschedError(Exception):
    """Base class of every error raised on purpose by distsched."""

    field: str | None = None

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if field is not None:
            self.field = field

    def __str__(self) -> str:
        return self.message


class ValidationError(DistschedError):
    """Bad input: nothing was written."""


class InvalidName(ValidationError):
    field = "name"


class DuplicateName(ValidationError):
    field = "name"


class UnknownTask(ValidationError):
    field = "task_name"


class DuplicateTask(DistschedError):
    """Two different functions registered under one task name."""


class InvalidInterval(ValidationError):
    field = "interval_seconds"


class InvalidCron(ValidationError):
    field = "cron"


class UnknownTimezone(ValidationError):
    field = "timezone"


class RunAtInPast(ValidationError):
    field = "run_at"


class InvalidPayload(ValidationError, TypeError, ValueError):
    """args/kwargs are not JSON, have the wrong shape, are too big or too deep.

    Also a ``TypeError`` and a ``ValueError``: what Django's task framework raises for arguments it
    cannot hold (a type JSON has not, undecodable bytes), so code written against its reference
    backends catches every payload distsched's ``Task.enqueue`` refuses, which is always this one.
    """

    field = "kwargs"


class InvalidScheduleSpec(ValidationError):
    """The combination of kind fields does not describe one schedule."""

    field = "kind"


class NotFound(DistschedError):
    """No schedule, run or worker with that identifier."""


class ScheduleNotFound(NotFound):
    pass


class RunNotFound(NotFound):
    pass


class BulkActionNotFound(NotFound):
    pass


class UnknownVersion(NotFound):
    """The schedule's name never had that version (HTTP 404, like an unknown id)."""


class InvalidStateTransition(DistschedError):
    """The run's current state does not allow the requested action (HTTP 409)."""


class UniqueKeyTaken(InvalidStateTransition):
    """Another unfinished run of the same task holds the run's unique key (HTTP 409): requeueing
    it would make two, which the database forbids (``distsched_run_unique_active_key``)."""

    field = "unique_key"


class VersionConflict(InvalidStateTransition):
    """Someone changed the schedule since the version the caller read (HTTP 409): nothing was
    written. ``current`` is the schedule's version now."""

    field = "expected_version"

    def __init__(self, message: str, *, current: int) -> None:
        super().__init__(message)
        self.current = current


class RunCancelled(Exception):
    """Raised by a task (or ``context.raise_if_cancelled()``) to end a run as cancelled.

    Not a ``DistschedError``: it is a signal from task code, not an input error.
    """


class NotLeader(DistschedError):
    """A leader-only write found its term no longer leads (a successor took over): nothing was written."""
