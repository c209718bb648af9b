"""Host memory growth placed in the stage that made it, on LMDeploy 0.18's real pipeline (stand-in
TurboMind on the CPU): span boundaries read the process's resident memory, so a stage that keeps host
memory per request is named even with several requests in flight, which the 100 ms sampler alone could
not do (docs/analysis.md, "Where"). The CPU counterpart of the GPU scenarios with host leaks (docs/accuracy.md)."""

from __future__ import annotations

import functools

import pytest
from lmdeploy import GenerationConfig
from opentelemetry.sdk.trace import TracerProvider

import vlmtrace
from tests.instrumentation.conftest import image, standin_engines  # noqa: F401 - fixture
from tests.support.cpu_lmdeploy import standin_pipeline
from vlmtrace import semconv as sc
from vlmtrace.analysis.pipeline import analyze
from vlmtrace.analysis.readers.detect import read_inputs
from vlmtrace.instrumentation import instrumentor
from vlmtrace.probes.memory import MemoryProbe

MiB = 1 << 20
GEN = GenerationConfig(max_new_tokens=4, top_k=1)
REQUESTS, IN_FLIGHT = 120, 4


def _touched(size: int) -> bytearray:
    block = bytearray(size)
    block[::4096] = b"\1" * len(range(0, size, 4096))
    return block


def _keep_host_memory_in_vision_preprocess(monkeypatch, kept: list) -> None:
    """Installed before instrument(), as the matrix does: vlmtrace's wrapper then calls this, and the
    damage runs inside the lmdeploy.vision.preprocess span."""
    from lmdeploy.vl.engine import ImageEncoder

    original = ImageEncoder.preprocess

    async def preprocess(encoder, *args, **kwargs):
        kept.append(_touched(MiB))
        return await original(encoder, *args, **kwargs)

    monkeypatch.setattr(ImageEncoder, "preprocess", preprocess)


def _record(tmp_path, monkeypatch, host_at_boundaries: bool):
    kept: list = []
    _keep_host_memory_in_vision_preprocess(monkeypatch, kept)
    monkeypatch.setattr(
        instrumentor, "MemoryProbe", functools.partial(MemoryProbe, host_at_boundaries=host_at_boundaries)
    )
    journal = tmp_path / "journal"
    vlmtrace.instrument(tracer_provider=TracerProvider(), journal=str(journal), sample_interval_ms=100)
    try:
        pipe = standin_pipeline()
        for _call in range(REQUESTS // IN_FLIGHT):
            pipe([("describe this image", image(64 + 8 * (i % 5), 48, i)) for i in range(IN_FLIGHT)], gen_config=GEN)
        pipe.close()
    finally:
        vlmtrace.uninstrument()
    assert len(kept) == REQUESTS
    return analyze(read_inputs([str(journal)]))


@pytest.mark.lmdeploy
def test_host_growth_is_placed_in_the_stage_that_keeps_it(standin_engines, tmp_path, monkeypatch):  # noqa: F811
    analysis = _record(tmp_path, monkeypatch, host_at_boundaries=True)
    (process,) = analysis.data.processes
    assert process.resource[sc.RESOURCE_HOST_AT_BOUNDARIES] is True
    (host,) = [v for v in analysis.summary.verdicts if v.component == "host"]
    assert host.klass == "host_growth", host
    assert host.slope_bytes_per_request == pytest.approx(MiB, rel=0.1)
    assert host.stage == sc.STAGE_VISION_PREPROCESS, host.evidence
    assert host.evidence["stage_uncertain"] is None


@pytest.mark.lmdeploy
def test_without_boundary_readings_the_sampler_alone_cannot_name_the_stage(standin_engines, tmp_path, monkeypatch):  # noqa: F811
    """The same run with host memory read by the sampler only (the journals before this change): every
    100 ms interval holds every stage of several requests, so the stage is withheld, not guessed."""
    analysis = _record(tmp_path, monkeypatch, host_at_boundaries=False)
    assert analysis.data.processes[0].resource[sc.RESOURCE_HOST_AT_BOUNDARIES] is False
    (host,) = [v for v in analysis.summary.verdicts if v.component == "host"]
    assert host.klass == "host_growth"
    assert host.stage is None and "sampler" in host.evidence["stage_uncertain"], host.evidence
