"""OpenTelemetry tracing, when the `otel` extra (opentelemetry-api) is installed; nothing otherwise.

The producer stores the W3C trace context of the span current at enqueue (`traceparent`,
`tracestate`) in the task's `headers`; each attempt runs in a CONSUMER span whose parent is that
context, so a trace shows the request that enqueued a task, then every attempt of it, with the
spans the handler makes nested inside. See docs/observability.md.

opentelemetry is imported once, here: without it TRACER is None, and callers check that before
doing anything else, so a worker without the extra does no per-attempt work for tracing. With the
API but no SDK configured (no tracer provider set), nothing would record a span: the worker starts
none (sdk_configured), which spares it about 5 µs per attempt.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

try:
    from opentelemetry import propagate, trace
    from opentelemetry.context import Context
except ImportError:  # the `otel` extra is not installed
    propagate = trace = Context = None

TRACER: Any = None if trace is None else trace.get_tracer("queueworker")
# The parent of an attempt whose task carries no headers: none (a root span).
ROOT: Any = None if Context is None else Context()
# The value of `messaging.system` on every span.
SYSTEM = "queueworker"


def sdk_configured() -> bool:
    """Whether the application has set a tracer provider (an SDK): asked per claim, so a provider
    set after this module was imported (by a handler module, say) counts from then on."""
    return TRACER is not None and not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def current_headers() -> dict[str, str] | None:
    """The current span's trace context as headers to store with a task; None when tracing is not
    installed or no valid span is current (nothing worth carrying)."""
    if TRACER is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier or None


def _stored_headers(headers_json: str | None) -> dict[str, str]:
    """A task's stored headers; anything but a JSON object of strings (written by hand, or by another
    language's producer; nested deeper than Python's parser goes) counts as none, so a bad header
    never fails the task, nor the attempt before it starts."""
    if headers_json is None:
        return {}
    try:
        headers = json.loads(headers_json)
    except (ValueError, RecursionError):
        return {}
    if not isinstance(headers, dict):
        return {}
    return {key: value for key, value in headers.items() if isinstance(value, str)}


class TracedAttempt(Protocol):
    """What an attempt's span says of it (queueworker.runtime.attempt.Attempt has these): a protocol,
    so this module, which producers import too, needs nothing of the worker runtime."""

    id: int
    queue: str
    task: str
    attempt: int
    max_attempts: int
    headers_json: str | None


@contextmanager
def attempt_span(attempt: TracedAttempt) -> Iterator[Any]:
    """The span of one attempt, current while the handler runs: a child of the producer's span
    (from the task's headers), or a root span when the task carries no trace context."""
    parent = ROOT if attempt.headers_json is None else propagate.extract(_stored_headers(attempt.headers_json))
    with TRACER.start_as_current_span(f"queueworker.run {attempt.task}", context=parent,
                                      kind=trace.SpanKind.CONSUMER, record_exception=False,
                                      set_status_on_exception=False) as span:
        if span.is_recording():  # not with the API alone (no SDK), nor when the trace is not sampled
            span.set_attributes({
                "messaging.system": SYSTEM, "messaging.operation.type": "process",
                "messaging.destination.name": attempt.queue, "messaging.message.id": str(attempt.id),
                "queueworker.task.id": attempt.id, "queueworker.task.name": attempt.task,
                "queueworker.task.attempt": attempt.attempt, "queueworker.task.max_attempts": attempt.max_attempts})
        yield span


def record_outcome(span: Any, outcome: str, error_type: str | None = None) -> None:
    """Sets the attempt's outcome (succeeded, continued, retrying, failed, snoozed, handed_back,
    cancelled, lease_lost, shutdown) and, for a failure, its error type and an ERROR status. The
    error's message is not recorded: it may quote what the handler was given (the worker scrubs
    it before storing it in the task row, where it can be read)."""
    if not span.is_recording():
        return
    span.set_attribute("queueworker.task.outcome", outcome)
    if error_type is not None:
        span.set_attribute("error.type", error_type)
        if outcome in ("retrying", "failed"):
            span.set_status(trace.Status(trace.StatusCode.ERROR, error_type))


@contextmanager
def controller_tick_span(namespace: str, name: str) -> Iterator[Any]:
    """The span of one reconcile tick of a QueueWorker; a no-op context without the extra."""
    if TRACER is None:
        yield None
        return
    with TRACER.start_as_current_span("queueworker.reconcile", kind=trace.SpanKind.INTERNAL, attributes={
            "k8s.namespace.name": namespace, "queueworker.queueworker.name": name}) as span:
        yield span


def annotate_current(attributes: dict[str, str | int]) -> None:
    """Sets attributes on the current span (the controller's tick: its decision and replicas)."""
    if TRACER is not None:
        trace.get_current_span().set_attributes(attributes)
