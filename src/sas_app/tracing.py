"""OpenTelemetry traces from ``submit`` through the Scheduler and the agents; off by default.

``SAS_TRACING=otlp`` exports to the OTLP/HTTP endpoint in ``OTEL_EXPORTER_OTLP_ENDPOINT`` (the
``tracing`` extra installs the exporter); ``SAS_TRACING=console`` prints spans to the process's
output. Celery's own instrumentation (``opentelemetry-instrumentation-celery``) carries the
trace context in each message's headers, so a run is one trace: the ``sas.submit`` span, each
agent task's span, and, since replies run in the agent's process, every next dispatch beneath it.
With ``SAS_TRACING`` unset nothing is imported and :func:`span` costs one check.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)

MODES = ("", "console", "otlp")
_enabled = False


def setup(mode: str, service: str = "sas_app") -> None:
    """Install a tracer provider (once per process) and Celery's instrumentation."""
    global _enabled
    if mode not in MODES:
        raise ValueError(f"SAS_TRACING={mode!r} must be one of: console, otlp (or empty: off)")
    if not mode or _enabled:
        return
    from opentelemetry import trace
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    if mode == "console":
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    CeleryInstrumentor().instrument()  # type: ignore[no-untyped-call]
    _enabled = True
    log.info("tracing on (%s)", mode)


def shutdown() -> None:
    """Stop tracing in this process: Celery's instrumentation removed, no more ``sas.submit`` spans."""
    global _enabled
    if not _enabled:
        return
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    CeleryInstrumentor().uninstrument()  # type: ignore[no-untyped-call]
    _enabled = False


@contextmanager
def span(name: str, **attributes: Any) -> Iterator[None]:
    """A span named ``name`` around the block when tracing is on; nothing otherwise."""
    if not _enabled:
        yield
        return
    from opentelemetry import trace

    with trace.get_tracer("sas_app").start_as_current_span(name, attributes=attributes):
        yield
