"""The H200 scenario matrix (benchmarks/gpu_matrix.py, docs/gpu-runs.md): the committed journals of it
are re-analysed and graded as the matrix's table grades them. The table in docs/gpu-runs.md was made
once, the rules decided on the `tune` half and the `held_out` half reported as it came out; this test
keeps the analyzer from changing its answers on those runs unnoticed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import analyse

MATRIX = Path(__file__).parent / "data" / "gpu" / "matrix"
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import gpu_matrix  # noqa: E402

ENTRIES = {entry["id"]: entry for entry in json.loads((MATRIX / "manifest.json").read_text())}
RESULTS = {row["id"]: row for row in json.loads((MATRIX / "results.json").read_text())}
COMMITTED = sorted(identifier for identifier, entry in ENTRIES.items() if entry["committed"])


@pytest.mark.parametrize("identifier", COMMITTED)
def test_a_recorded_scenario_is_graded_as_in_the_table(identifier: str):
    row = gpu_matrix.grade(ENTRIES[identifier], analyse(MATRIX / f"{identifier}.jsonl.gz").summary)
    recorded = RESULTS[identifier]
    assert {key: row[key] for key in ("found", "class_right", "stage_found", "stage_right", "slope_right")} == \
        {key: recorded[key] for key in ("found", "class_right", "stage_found", "stage_right", "slope_right")}


def test_no_negative_of_the_matrix_is_called_a_leak():
    negatives = [row for row in RESULTS.values() if ENTRIES[row["id"]]["expected_class"] == "negative"]
    assert len(negatives) == 12 and all(not row["leak_found"] for row in negatives)


def test_no_stage_of_a_live_reading_is_named_wrong_in_the_tune_half():
    """The rules were decided on this half: every stage named there is the injected one, or withheld."""
    wrong = [row["id"] for row in RESULTS.values() if row["half"] == "tune" and row["stage_right"] is False]
    assert wrong == ["pt-tensor-after_response-40x600-8MiB"]  # the request's end, bracketed with the pipeline
