"""OpenTelemetry: one trace from the enqueuing code into the run, spans for tick, claim and execution.

The SDK's in-memory exporter collects the spans (the global tracer provider is
set once per test process, as OpenTelemetry allows). Workers run in-process
(``run_once``), so producer and consumer spans land in the same exporter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from distsched_app.models import Run
from distsched_app.services import enqueue as enqueue_service
from tests.conftest import T0
from tests.testapp import tasks as t

pytestmark = pytest.mark.django_db

_EXPORTER = InMemorySpanExporter()


class _WhileCollecting(SpanProcessor):
    """Exports to ``_EXPORTER`` only during this module's tests; the provider stays installed for
    the rest of the session (OpenTelemetry allows one per process), exporting nothing."""

    collecting = False

    def on_end(self, span: ReadableSpan) -> None:
        if self.collecting:
            _EXPORTER.export((span,))


_PROCESSOR = _WhileCollecting()


@pytest.fixture(scope="module", autouse=True)
def _provider():
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(_PROCESSOR)
        trace.set_tracer_provider(provider)
    _PROCESSOR.collecting = True
    yield
    _PROCESSOR.collecting = False


@pytest.fixture
def spans():
    _EXPORTER.clear()

    def finished(name: str | None = None):
        found = list(_EXPORTER.get_finished_spans())
        return [s for s in found if name is None or s.name == name]

    return finished


@pytest.fixture
def worker(scheduler):
    return scheduler.worker(worker_id="w1", heartbeat_seconds=3600)


def _hex(span_id: int) -> str:
    return format(span_id, "016x")


def test_a_request_enqueue_and_run_form_one_trace(worker, spans):
    with trace.get_tracer("tests").start_as_current_span("POST /signup") as request:
        result = t.ft_add.enqueue(2, 3)
    run = Run.objects.get(pk=int(result.id))
    assert run.trace_context["traceparent"].split("-")[1] == format(request.get_span_context().trace_id, "032x")
    worker.run_once()

    (request_span,) = spans("POST /signup")
    (enqueue_span,) = spans("enqueue tests.testapp.tasks.ft_add")
    (run_span,) = spans("run tests.testapp.tasks.ft_add")
    assert enqueue_span.kind == SpanKind.PRODUCER and run_span.kind == SpanKind.CONSUMER
    assert enqueue_span.parent.span_id == request_span.context.span_id
    assert run_span.parent.span_id == enqueue_span.context.span_id
    assert {request_span.context.trace_id, enqueue_span.context.trace_id, run_span.context.trace_id} == {
        request_span.context.trace_id
    }
    assert enqueue_span.attributes["messaging.message.id"] == str(run.pk)
    assert enqueue_span.attributes["messaging.destination.name"] == "default"
    assert dict(run_span.attributes) == {
        "messaging.system": "distsched",
        "messaging.operation.type": "process",
        "messaging.destination.name": "default",
        "messaging.message.id": str(run.pk),
        "distsched.run.id": run.pk,
        "distsched.task": "tests.testapp.tasks.ft_add",
        "distsched.run.attempt": 1,
        "distsched.run.origin": "enqueued",
        "distsched.worker.id": "w1",
        "distsched.run.outcome": "succeeded",
    }
    assert run_span.status.status_code == StatusCode.UNSET


def test_a_failed_attempt_records_its_exception_on_the_execution_span(worker, spans):
    t.ft_fail.enqueue("no luck")
    worker.run_once()
    (run_span,) = spans("run tests.testapp.tasks.ft_fail")
    assert run_span.status.status_code == StatusCode.ERROR
    assert run_span.attributes["distsched.run.outcome"] == "failed"
    (event,) = [e for e in run_span.events if e.name == "exception"]
    assert event.attributes["exception.type"] == "builtins.ValueError"
    assert event.attributes["exception.message"] == "no luck"
    assert "Traceback" in event.attributes["exception.stacktrace"]


def test_a_trigger_is_the_parent_of_the_triggered_run(scheduler, worker, spans):
    scheduler.create_schedule(
        name="nightly", task_name="tests.noop", interval_seconds=3600, start_at=T0 + timedelta(days=1)
    )
    with trace.get_tracer("tests").start_as_current_span("admin action"):
        run = scheduler.trigger("nightly")
    assert Run.objects.get(pk=run.pk).trace_context is not None
    worker.run_once()
    (trigger_span,) = spans("trigger nightly")
    (run_span,) = spans("run tests.noop")
    assert run_span.parent.span_id == trigger_span.context.span_id
    assert run_span.attributes["distsched.run.origin"] == "manual"


def test_a_scheduled_run_starts_its_own_trace_and_the_tick_and_claim_are_spans(scheduler, worker, clock, spans):
    scheduler.create_schedule(name="every-minute", task_name="tests.noop", interval_seconds=60, start_at=T0)
    scheduler.tick()
    worker.run_once()
    (tick_span,) = spans("distsched.tick")
    assert tick_span.attributes["distsched.tick.runs_created"] == 1
    (claim_span,) = spans("distsched.claim")
    assert claim_span.attributes["distsched.claim.runs"] == 1
    assert claim_span.attributes["distsched.worker.id"] == "w1"
    (run_span,) = spans("run tests.noop")
    assert run_span.parent is None
    assert Run.objects.get().trace_context is None
    assert claim_span.end_time <= run_span.start_time


def test_idle_ticks_and_empty_claims_make_no_spans(scheduler, worker, spans):
    scheduler.create_schedule(
        name="later", task_name="tests.noop", interval_seconds=60, start_at=T0 + timedelta(hours=1)
    )
    for _ in range(3):
        scheduler.tick()
        assert worker.run_once() is None
    assert spans() == []


def test_spans_a_task_makes_nest_under_its_execution_span(worker, spans):
    t.ft_child_span.enqueue()
    worker.run_once()
    (run_span,) = spans("run tests.testapp.tasks.ft_child_span")
    (inner,) = spans("inside the task")
    assert inner.parent.span_id == run_span.context.span_id


def test_an_async_task_runs_inside_its_execution_span(worker, spans):
    result = t.ft_async_span.enqueue()
    worker.run_once()
    (run_span,) = spans("run tests.testapp.tasks.ft_async_span")
    assert Run.objects.get(pk=int(result.id)).result == _hex(run_span.context.span_id)


def test_bulk_enqueue_carries_the_callers_trace(spans):
    with trace.get_tracer("tests").start_as_current_span("import job") as outer:
        runs = enqueue_service.enqueue_many([enqueue_service.Job(task_name="tests.noop") for _ in range(3)], now=T0)
    trace_id = format(outer.get_span_context().trace_id, "032x")
    stored = Run.objects.filter(pk__in=[r.pk for r in runs]).values_list("trace_context", flat=True)
    assert [c["traceparent"].split("-")[1] for c in stored] == [trace_id] * 3
    (batch,) = spans("enqueue_many")
    assert batch.attributes["messaging.batch.message_count"] == 3


def test_without_opentelemetry_installed_tracing_is_a_no_op():
    """A fresh interpreter in which ``import opentelemetry`` fails, as on a machine without it."""
    script = """
import sys
sys.modules["opentelemetry"] = None  # import opentelemetry -> ImportError
from distsched_app import tracing
assert not tracing.ENABLED
assert tracing.carrier() is None
with tracing.producer(lambda: ("enqueue x", {"a": 1})) as span:
    span.set("b", 2)
with tracing.consumer({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}, lambda: ("run x", {})) as span:
    span.fail(ValueError("boom"))
def claim():
    return [1]
assert tracing.when_busy("distsched.claim", lambda result, **kw: {"n": 1})(claim) is claim  # not even wrapped
print("ok")
"""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_with_the_api_but_no_sdk_distsched_makes_no_spans_and_stores_no_context():
    """opentelemetry-api often arrives as another package's dependency, with no SDK configured:
    every span would be a no-op, so the enqueue path skips them (a fresh interpreter, no provider)."""
    script = """
from opentelemetry import trace
from distsched_app import tracing
assert tracing.ENABLED and not tracing.active()
with trace.get_tracer("x").start_as_current_span("request"):
    with tracing.producer(lambda: ("enqueue x", {})) as span:
        assert tracing.carrier() is None
print("ok")
"""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    env.pop("OTEL_PYTHON_TRACER_PROVIDER", None)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_stored_context_is_the_propagators_carrier(spans):
    with trace.get_tracer("tests").start_as_current_span("caller"):
        result = t.ft_noop.enqueue()
    stored = Run.objects.get(pk=int(result.id)).trace_context
    assert set(stored) == {"traceparent"}
    assert json.loads(json.dumps(stored)) == stored


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ is broken")


def test_an_exception_that_cannot_describe_itself_is_recorded_from_the_workers_description(scheduler, worker, spans):
    def raise_unprintable(context):
        raise _Unprintable()

    t.HOOKS["unprintable"] = raise_unprintable
    try:
        scheduler.create_schedule(name="bad", task_name="tests.hook", kwargs={"name": "unprintable"}, run_at=T0)
        scheduler.tick()
        execution = worker.run_once()
    finally:
        del t.HOOKS["unprintable"]
    assert execution.state == "retrying"  # a failed attempt, and the worker went on
    (run_span,) = spans("run tests.hook")
    assert run_span.status.status_code == StatusCode.ERROR
    (event,) = [e for e in run_span.events if e.name == "exception"]
    assert event.attributes["exception.type"].endswith("._Unprintable")
    assert event.attributes["exception.message"] == "_Unprintable: <unprintable exception>"


@pytest.mark.parametrize(
    "stored",
    [{"traceparent": "not a traceparent"}, {"traceparent": 7}, ["00-x"], "00-abc", {"a": {"b": "c"}}],
    ids=["malformed", "number", "list", "string", "nested"],
)
def test_a_stored_context_that_is_not_one_starts_a_trace_of_its_own(worker, spans, stored):
    result = t.ft_noop.enqueue()
    Run.objects.filter(pk=int(result.id)).update(trace_context=stored)  # as by hand, or an old row
    assert worker.run_once().state == "succeeded"
    (run_span,) = spans("run tests.testapp.tasks.ft_noop")
    assert run_span.parent is None


def test_a_busy_call_that_fails_is_a_span_with_its_exception(spans):
    from distsched_app import tracing

    @tracing.when_busy("distsched.claim", lambda runs, **kwargs: {"distsched.claim.runs": len(runs)})
    def claim(*, fail: bool) -> list[int]:
        if fail:
            raise RuntimeError("database gone")
        return []

    assert claim(fail=False) == []
    with pytest.raises(RuntimeError):
        claim(fail=True)
    (span,) = spans("distsched.claim")  # the empty claim made none
    assert span.status.status_code == StatusCode.ERROR
    (event,) = span.events
    assert event.attributes["exception.message"] == "database gone"
