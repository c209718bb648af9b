"""Allocation sites captured on a real GPU (H100, LMDeploy 0.18, both engines): a CUDA tensor of 4 MiB kept
per image in `ImageEncoder.preprocess` at a known line of benchmarks/gpu_capture.py, captured by torch's
memory history in the window `capture="auto"` opened, and a run without the leak. Re-read here, the
verdict names the leak's stage and its file and line as the first allocation site."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import analyse, verdict

GPU = Path(__file__).parent / "data" / "gpu"
LEAK_LINE = 43  # benchmarks/gpu_capture.py, where install_leak's preprocess keeps the tensor


@pytest.mark.parametrize("backend", ["pytorch", "turbomind"])
def test_a_tensor_leak_in_vision_preprocessing_is_named_by_its_file_and_line(backend):
    tensor = verdict(analyse(GPU / f"capture-{backend}-tensor.jsonl.gz"), "tensor")
    assert tensor.klass == "tensor_leak" and tensor.stage == "vision.preprocess"
    assert tensor.slope_bytes_per_request == pytest.approx(4 << 20, rel=0.1)
    first = tensor.allocation_sites[0]
    assert Path(first["file"]).name == "gpu_capture.py" and first["line"] == LEAK_LINE
    assert first["function"].endswith("preprocess") and first["stage"] == "vision.preprocess"
    assert 0.8 <= tensor.allocation_sites_explained <= 1.2


@pytest.mark.parametrize("backend", ["pytorch", "turbomind"])
def test_a_run_without_a_leak_opens_no_window_reads_as_no_growth_and_names_no_site(backend):
    analysis = analyse(GPU / f"capture-{backend}-none.jsonl.gz")
    assert not analysis.summary.leak_found and not analysis.data.captures  # no window opened
    assert all(not v.allocation_sites for v in analysis.summary.verdicts)


def test_at_2b_on_the_pytorch_engine_the_allocation_sites_name_the_stage_the_spans_could_not():
    """The 2B-shaped model's preprocessing runs beside the engine's forward passes: the spans share the
    tensor growth between vision.preprocess and no span, and the capture window's sites settle it."""
    tensor = verdict(analyse(GPU / "capture-2b-pytorch-tensor.jsonl.gz"), "tensor")
    assert tensor.klass == "tensor_leak" and tensor.stage == "vision.preprocess"
    named = tensor.evidence["stage_from_sites"]
    assert named["stage"] == "vision.preprocess" and 0.8 <= named["explains"] <= 1.2
    assert "cannot tell which held the memory" in named["spans_said"] and not tensor.evidence["stage_uncertain"]
    assert "allocation sites" in tensor.evidence["decision"]["stage"]
    first = tensor.allocation_sites[0]
    assert Path(first["file"]).name == "gpu_capture.py" and first["line"] == LEAK_LINE
