"""Fixtures: an in-memory span exporter, and LMDeploy 0.18's real pipeline over the stand-in engine."""

from __future__ import annotations

import numpy as np
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from PIL import Image

import vlmtrace
from tests.support.cpu_lmdeploy import cpu_lmdeploy, tiny_vlm_path

pytest.importorskip("lmdeploy", reason="the real LMDeploy Python code is needed (scripts/test installs it)")


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


@pytest.fixture(scope="session")
def standin_engines():
    with cpu_lmdeploy() as built:
        yield built


@pytest.fixture(scope="session")
def cpu_pipeline(standin_engines):
    from lmdeploy import TurbomindEngineConfig, VisionConfig, pipeline

    pipe = pipeline(tiny_vlm_path(), backend_config=TurbomindEngineConfig(session_len=2048, max_batch_size=4),
                    vision_config=VisionConfig(max_batch_size=2), log_level="ERROR")
    yield pipe
    pipe.close()


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
