"""The OpenTelemetry SDK with an in-memory exporter, installed once per test process (the global
tracer provider can be set only once), for tests that read the spans queueworker makes."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

EXPORTER = InMemorySpanExporter()


def _install() -> None:
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
        trace.set_tracer_provider(provider)


def recording() -> Iterator[Callable[..., list[ReadableSpan]]]:
    """For a fixture: installs the SDK, then yields a function returning the spans finished since
    (those whose name starts with the prefix given)."""
    _install()
    EXPORTER.clear()

    def spans(name_prefix: str = "") -> list[ReadableSpan]:
        return [span for span in EXPORTER.get_finished_spans() if span.name.startswith(name_prefix)]

    yield spans
    EXPORTER.clear()
