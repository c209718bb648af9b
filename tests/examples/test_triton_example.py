"""examples/triton: the python-backend model.py, run as Triton runs it, against a stand-in pb_utils module and
LMDeploy's real pipeline over the CPU stand-in engine."""

from __future__ import annotations

import importlib.util
import io
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.export.journal_lines import read_journal_file
from tests.instrumentation.conftest import image, standin_engines  # noqa: F401 - fixture
from tests.support import triton_stub
from tests.support.cpu_lmdeploy import tiny_vlm_path

REPOSITORY = Path(__file__).resolve().parents[2] / "examples" / "triton" / "model_repository" / "minicpm-v-2_6"


def _config_pbtxt() -> str:
    return (REPOSITORY / "config.pbtxt").read_text()


def _model_config(model_path: str, empty_cache: bool) -> dict:
    """The model_config Triton passes to initialize() as JSON, for this config.pbtxt (and a model path)."""
    text = _config_pbtxt()
    parameters = dict(re.findall(r'key:\s*"(\w+)"\s*value:\s*\{\s*string_value:\s*"([^"]*)"', text))
    parameters.update(model_path=model_path, empty_cache=str(empty_cache).lower())
    return {
        "name": re.search(r'^name:\s*"([^"]+)"', text, re.M).group(1),
        "backend": "python",
        "max_batch_size": int(re.search(r"^max_batch_size:\s*(\d+)", text, re.M).group(1)),
        "parameters": {key: {"string_value": value} for key, value in parameters.items()},
    }


def _load_model(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", triton_stub.as_module())
    spec = importlib.util.spec_from_file_location("triton_example_model", REPOSITORY / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TritonPythonModel()


def _request(query: str, image_bytes: bytes) -> triton_stub.InferenceRequest:
    return triton_stub.InferenceRequest(
        [
            triton_stub.Tensor("query", np.array([[query.encode()]], dtype=np.object_)),
            triton_stub.Tensor("image", np.array([[image_bytes]], dtype=np.object_)),
        ]
    )


def _jpeg(width: int, height: int, seed: int) -> bytes:
    buffer = io.BytesIO()
    image(width, height, seed).save(buffer, format="JPEG")
    return buffer.getvalue()


def test_the_config_declares_what_model_py_reads():
    text = _config_pbtxt()
    assert re.search(r'^backend:\s*"python"', text, re.M)
    inputs = re.findall(r'name:\s*"(\w+)"\s*data_type:\s*(\w+)', text.split("output [")[0])
    assert inputs == [("query", "TYPE_STRING"), ("image", "TYPE_STRING")]
    assert re.findall(r'name:\s*"(\w+)"\s*data_type:\s*(\w+)', text.split("output [")[1]) == [
        ("response", "TYPE_STRING")
    ]
    assert set(_model_config("m", False)["parameters"]) == {"model_path", "session_len", "empty_cache"}


@pytest.mark.lmdeploy
def test_the_model_serves_a_dynamic_batch_and_leaves_a_closed_journal(standin_engines, monkeypatch, tmp_path):  # noqa: F811
    journal = tmp_path / "journal"
    monkeypatch.setenv("VLMTRACE_JOURNAL", str(journal))
    monkeypatch.setenv("VLMTRACE_SAMPLE_INTERVAL_MS", "20")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    model = _load_model(monkeypatch)
    model.initialize(
        {
            "model_config": json.dumps(_model_config(tiny_vlm_path(), empty_cache=True)),
            "model_name": "minicpm-v-2_6",
            "model_version": "1",
        }
    )
    model.gen_config.max_new_tokens = 6
    try:
        responses = model.execute(
            [
                _request("describe this image", _jpeg(120, 90, 1)),
                _request("what is it?", b"not an image"),
                _request("and this one", _jpeg(64, 200, 2)),
            ]
        )
    finally:
        model.finalize()

    assert [r.has_error() for r in responses] == [False, True, False]
    assert "bad input" in responses[1].error().message()
    for response in (responses[0], responses[2]):
        (text,) = triton_stub.get_output_tensor_by_name(response, "response").as_numpy().reshape(-1)
        assert isinstance(text, bytes)

    records = [
        record
        for path in journal.glob("*.jsonl")
        for record in read_journal_file(path)[0]  # format 3's ends completed from their starts
    ]
    ends = [r for r in records if r["k"] == "end"]
    (batch,) = [r for r in ends if r["name"] == "lmdeploy.pipeline.infer"]
    assert batch["attrs"]["vlmtrace.pipeline.prompts"] == 2 and batch["attrs"]["vlmtrace.pipeline.images"] == 2
    requests = [r for r in ends if r["name"].startswith("chat ")]
    assert len(requests) == 2 and {r["trace_id"] for r in requests} == {batch["trace_id"]}
    assert sorted(r["attrs"]["vlmtrace.request.image_pixels"] for r in requests) == [120 * 90, 64 * 200]
    # the workaround after the batch, timed (LMDeploy also calls it while it builds the pipeline)
    assert any(r["start"] >= batch["t"] for r in ends if r["name"] == "torch.cuda.empty_cache")
    assert any(r["k"] == "sample" for r in records)
    assert records[-1]["k"] == "end_marker" and records[-1]["clean"]
