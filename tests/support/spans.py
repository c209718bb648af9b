"""Tracing into memory, reading the spans a test produced, and test images (shared by the 0.18
suite and the release matrix; a conftest imports the fixtures to use them)."""

from __future__ import annotations

import numpy as np
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from PIL import Image

import vlmtrace


@pytest.fixture
def exporter():
    return InMemorySpanExporter()


@pytest.fixture
def traced(exporter):
    """vlmtrace instrumented into an in-memory exporter; no journal, no sampler thread."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    session = vlmtrace.instrument(tracer_provider=provider, journal=None, sample_interval_ms=0)
    yield session
    vlmtrace.uninstrument()


def image(width: int, height: int, seed: int = 0) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def finished(exporter) -> tuple:
    """The spans exported so far: vlmtrace hands ended spans to the processors on a thread of its own."""
    vlmtrace.flush()
    return exporter.get_finished_spans()


def spans_by_name(exporter) -> dict[str, list]:
    found: dict[str, list] = {}
    for span in finished(exporter):
        found.setdefault(span.name, []).append(span)
    return found


def parent_of(span, exporter):
    if span.parent is None:
        return None
    return next((s for s in finished(exporter) if s.context.span_id == span.parent.span_id), None)
