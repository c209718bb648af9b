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
