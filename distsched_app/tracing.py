"""OpenTelemetry spans and trace context, when ``opentelemetry-api`` is installed and a tracer
provider (an SDK) is configured; no-ops otherwise.

What is traced (``docs/operations.md``, "Tracing"):

- ``enqueue <task>`` / ``trigger <schedule>`` (PRODUCER): the code that made a run.
  Its trace context is stored on the run (``Run.trace_context``, the global
  propagator's carrier, W3C ``traceparent`` by default) so that the run's
  execution continues the same trace: request -> enqueue -> run.
- ``run <task>`` (CONSUMER): each execution on a worker, a child of the stored
  context (a root span for scheduled runs), current while the task runs so
  that spans the task makes nest under it; the exception of a failed attempt
  is recorded on it.
- ``distsched.tick`` and ``distsched.claim``: recorded only when they created or
  claimed something or failed, after the fact with their real start time (an
  idle worker polls every second; a span per empty poll would bury the rest).

Attributes follow OpenTelemetry's messaging conventions where one fits
(``messaging.system``, ``messaging.destination.name``, ``messaging.message.id``)
plus ``distsched.*`` ones. Nothing here reads the database or the scheduler's
clock: span times are the tracer's own (wall clock).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import wraps
from typing import Any, ParamSpec, TypeVar

try:  # optional: distsched neither needs nor installs it
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # pragma: no cover - exercised by the tests' venv without the package
    trace = None  # type: ignore[assignment]

ENABLED = trace is not None  # the API is installed
SYSTEM = "distsched"
_NO_SDK: tuple[type, ...] = (trace.ProxyTracerProvider, trace.NoOpTracerProvider) if ENABLED else ()

P = ParamSpec("P")
R = TypeVar("R")
AttributeValue = str | int | float | bool
Attributes = Mapping[str, AttributeValue]


def active() -> bool:
    """Spans would go somewhere: the API is installed and a tracer provider (an SDK) is set.
    Without one every span is a no-op, so distsched skips them (the enqueue path is hot)."""
    return ENABLED and not isinstance(trace.get_tracer_provider(), _NO_SDK)


def _tracer() -> Any:
    return trace.get_tracer("distsched_app")


class _Span:
    """What a caller may do with the span of a ``with`` block (nothing, when tracing is off)."""

    def __init__(self, span: Any = None) -> None:
        self._span = span

    def set(self, name: str, value: AttributeValue) -> None:
        if self._span is not None:
            self._span.set_attribute(name, value)

    def fail(self, exc: BaseException, *, error_class: str = "", error: str = "", tb: str = "") -> None:
        """Mark the span failed with the exception (caught by the caller, so not seen by the block).

        Task code raised it, so it may be hostile (a ``__str__`` that raises): the caller's own
        description and traceback are recorded then, and nothing here ever raises."""
        if self._span is None:
            return
        attributes = {"exception.type": error_class} if error_class else {}
        try:
            self._span.record_exception(exc, attributes=attributes or None)
        except Exception:  # noqa: BLE001 - the exception cannot describe itself
            self._span.add_event(
                "exception",
                {**attributes, "exception.type": error_class or "unknown", "exception.message": error,
                 "exception.stacktrace": tb},
            )  # fmt: skip
        self._span.set_status(Status(StatusCode.ERROR, type(exc).__name__))


_NO_SPAN = nullcontext(_Span())  # reusable: what every block gets while tracing is off


def producer(describe: Callable[[], tuple[str, Attributes]]) -> AbstractContextManager[_Span]:
    """The span of the code that makes a run (enqueue, trigger), current inside the block, so
    that ``carrier()`` called there names it. ``describe()`` gives its name and attributes
    (only called when tracing: an enqueue is a web request's hot path)."""
    return _producer(*describe()) if active() else _NO_SPAN


@contextmanager
def _producer(name: str, attributes: Attributes) -> Iterator[_Span]:
    with _tracer().start_as_current_span(
        name, kind=SpanKind.PRODUCER, attributes={"messaging.system": SYSTEM, **attributes}
    ) as span:
        yield _Span(span)


def carrier() -> dict[str, str] | None:
    """The current trace context as the global propagator writes it, or None without one."""
    if not active():
        return None
    out: dict[str, str] = {}
    propagate.inject(out)
    return out or None


def consumer(
    parent: Mapping[str, str] | None, describe: Callable[[], tuple[str, Attributes]]
) -> AbstractContextManager[_Span]:
    """The span of one execution: a child of the stored ``parent`` context, current in the block.
    ``describe()`` gives its name and attributes (only called when tracing: this is per run)."""
    return _consumer(parent, *describe()) if active() else _NO_SPAN


@contextmanager
def _consumer(parent: Mapping[str, str] | None, name: str, attributes: Attributes) -> Iterator[_Span]:
    with _tracer().start_as_current_span(
        name,
        context=_extracted(parent),
        kind=SpanKind.CONSUMER,
        attributes={"messaging.system": SYSTEM, **attributes},
        record_exception=False,  # call_task catches everything; it reports through fail()
        set_status_on_exception=False,
    ) as span:
        yield _Span(span)


def _extracted(parent: Any) -> Any:
    """The stored context, if it is one (a row written by hand may hold anything): else a root span."""
    if not isinstance(parent, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in parent.items()):
        return None
    try:
        return propagate.extract(dict(parent))
    except Exception:  # noqa: BLE001 - a malformed carrier: the execution starts a trace of its own
        return None


def _record(name: str, started_ns: int, attributes: Attributes, exc: BaseException | None = None) -> None:
    span = _tracer().start_span(name, start_time=started_ns, attributes={"messaging.system": SYSTEM, **attributes})
    if exc is not None:
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
    span.end()


def when_busy(name: str, describe: Callable[..., Attributes]) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Trace a call as the span ``name`` only if it returned something (a non-empty result) or
    raised: after the fact, from its real start. ``describe(result, **kwargs)`` gives the
    attributes. The tick and the claim use it: an idle one is no news."""

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        if not ENABLED:
            return fn

        @wraps(fn)
        def traced(*args: P.args, **kwargs: P.kwargs) -> R:
            if not active():
                return fn(*args, **kwargs)
            started = time.time_ns()
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                _record(name, started, {}, exc)
                raise
            if result:
                _record(name, started, describe(result, **kwargs))
            return result

        return traced

    return decorate
