"""examples/batch_pipeline: batches of 40 image prompts, run on the CPU against LMDeploy's real pipeline."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.export.journal_lines import read_journal_file
from tests.instrumentation.conftest import standin_engines  # noqa: F401 - fixture
from tests.support.cpu_lmdeploy import tiny_vlm_path

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "batch_pipeline" / "batch_pipeline.py"


@pytest.mark.lmdeploy
def test_rounds_of_image_batches_leave_one_trace_per_round(standin_engines, tmp_path, monkeypatch, capsys):  # noqa: F811
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    spec = importlib.util.spec_from_file_location("batch_pipeline_example", SCRIPT)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.SIZES = ((48, 40), (64, 64), (40, 56))  # small images: the CPU runs the real image processor
    journal = tmp_path / "journal"
    assert (
        example.main(
            [
                "--model",
                tiny_vlm_path(),
                "--prompts",
                "5",
                "--rounds",
                "2",
                "--vision-batch",
                "1",
                "--max-new-tokens",
                "4",
                "--journal",
                str(journal),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.count("5 answers, 20 tokens") == 2 and f"vlmtrace report {journal}" in out

    records = [
        record
        for path in journal.glob("*.jsonl")
        for record in read_journal_file(path)[0]  # format 3's ends completed from their starts
    ]
    ends = [r for r in records if r["k"] == "end"]
    calls = [r for r in ends if r["name"] == "lmdeploy.pipeline.infer"]
    assert [(c["attrs"]["vlmtrace.pipeline.prompts"], c["attrs"]["vlmtrace.pipeline.images"]) for c in calls] == [
        (5, 5),
        (5, 5),
    ]
    requests = [r for r in ends if r["name"].startswith("chat ")]
    assert len(requests) == 10
    assert {r["trace_id"] for r in requests} == {c["trace_id"] for c in calls}
    vision = [r for r in ends if r["name"] == "lmdeploy.vision.preprocess"]
    assert len(vision) == 10 and {v["attrs"]["vlmtrace.vision.max_batch_size"] for v in vision} == {1}
    assert len({v["attrs"]["vlmtrace.vision.pixels"] for v in vision}) == 3
    assert records[-1]["k"] == "end_marker" and records[-1]["clean"]
