"""Journals recorded on an H200 with a known injected cause (data/gpu/README.md): the verdict names it."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import analyse, verdict

from vlmtrace import semconv as sc

GPU = Path(__file__).parent / "data" / "gpu"
MiB = 1 << 20
CASES = {
    "turbomind-tensor": ("tensor", "tensor_leak", sc.STAGE_VISION_PREPROCESS, 4 * MiB),
    "turbomind-cache": ("cache", "cache_retention", sc.STAGE_VISION_PREPROCESS, 20 * MiB),
    "turbomind-native": ("native", "native_growth", sc.STAGE_ENGINE_STREAM, 8 * MiB),
    "turbomind-host": ("host", "host_growth", sc.STAGE_ENGINE_STREAM, 4 * MiB),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_injected_cause_is_found_in_a_real_trace(name: str):
    component, klass, stage, rate = CASES[name]
    analysis = analyse(GPU / f"{name}.jsonl.gz")
    found = verdict(analysis, component)
    assert (found.klass, found.stage) == (klass, stage)
    assert abs(found.slope_bytes_per_request - rate) <= 0.1 * rate
    assert [v.component for v in analysis.summary.verdicts if v.klass != "no_growth"] == [component]
    assert not analysis.summary.crashed and analysis.summary.problems == []


def test_the_leak_per_image_is_found_as_the_driver():
    found = verdict(analyse(GPU / "turbomind-tensor.jsonl.gz"), "tensor")
    driver = found.evidence["driver"]
    assert driver["feature"] == "images" and abs(driver["bytes_per_unit"] - 4 * MiB) <= 0.1 * 4 * MiB


def _ended_spans(name: str) -> list[dict]:
    import gzip
    import json

    with gzip.open(GPU / name, "rt") as journal:
        return [record for record in map(json.loads, journal) if record["k"] == "end"]


@pytest.mark.parametrize("backend, engine_span", [("turbomind", "lmdeploy.turbomind.stream"),
                                                  ("pytorch", "lmdeploy.pytorch.forward")])
def test_recorded_runs_hold_one_parent_chain_per_request_and_the_engine(backend, engine_span):
    """docs/gpu-runs.md describes these runs; the chains and readings it quotes must stay in the files."""
    spans = _ended_spans(f"record-{backend}.jsonl.gz")
    by_id = {span["span_id"]: span for span in spans}
    requests = [span for span in spans if span["name"] == "chat tiny-qwen2vl"]
    assert len(requests) == 65
    for request in requests:
        assert by_id[request["parent_id"]]["name"] == sc.SPAN_PIPELINE_INFER
        assert 0 < request["attrs"][sc.GEN_AI_USAGE_OUTPUT_TOKENS] <= 16
        assert request["attrs"][sc.GEN_AI_RESPONSE_FINISH_REASONS][0] in ("length", "stop")
    vision = [span for span in spans if span["name"] == sc.SPAN_VISION_PREPROCESS]
    assert {by_id[by_id[span["parent_id"]]["parent_id"]]["name"] for span in vision} == {"chat tiny-qwen2vl"}
    assert all(span["attrs"][sc.VISION_PIXELS] > 0 and sc.MEM_GPU_PROCESS in span["attrs"] for span in vision)
    engine = [span for span in spans if span["name"] == engine_span]
    if backend == "turbomind":
        assert {by_id[span["parent_id"]]["name"] for span in engine} == {"chat tiny-qwen2vl"}
        assert {span["attrs"][sc.MEM_TORCH_ALLOCATED] for span in engine} == {0}  # TurboMind's own pool
        assert min(span["attrs"][sc.MEM_NATIVE] for span in engine) > 8 * 10**9
    else:
        request_ids = {span["span_id"] for span in requests}
        schedules = [span for span in spans if span["name"] == "lmdeploy.pytorch.schedule"]
        linked = {link["span_id"] for span in schedules for link in span["links"]}
        assert request_ids <= linked  # every request served by the steps linked to it
        assert min(span["attrs"][sc.MEM_TORCH_ALLOCATED] for span in engine) > 7 * 10**9  # the KV cache
        vit = [span for span in spans if span["name"] == sc.SPAN_VISION_FORWARD]
        assert vit and {by_id[span["parent_id"]]["name"] for span in vit} == {engine_span}
