"""benchmarks/matrix_keep.py: a graded matrix added to the committed ones, and their rows graded again."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import matrix_keep  # after the path

COMMITTED = matrix_keep.MATRIX
KEPT, NOT_KEPT = "tm-host-vision.preprocess-8x112-0.5MiB", "tm-hostlru-8x152-1MiB"  # the twenty-fifth's


def _entries(*identifiers: str) -> tuple[list[dict], list[dict]]:
    manifest = {entry["id"]: entry for entry in json.loads((COMMITTED / "manifest.json").read_text())}
    results = {row["id"]: row for row in json.loads((COMMITTED / "results.json").read_text())}
    return [dict(manifest[i]) for i in identifiers], [dict(results[i]) for i in identifiers]


def _matrix(folder: Path, manifest: list[dict], results: list[dict]) -> Path:
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps(manifest))
    (folder / "results.json").write_text(json.dumps(results))
    return folder


def test_a_matrix_is_added_with_the_journals_it_keeps(tmp_path: Path):
    matrix = _matrix(tmp_path / "matrix", [], [])
    manifest, graded = _entries(KEPT, NOT_KEPT)
    for entry in manifest:
        entry.pop("committed")
    for row in graded:
        row.pop("graded_at")
    (tmp_path / "m.json").write_text(json.dumps(manifest))
    (tmp_path / "g.json").write_text(json.dumps(graded))
    (tmp_path / "j" / KEPT).mkdir(parents=True)
    shutil.copy(COMMITTED / f"{KEPT}.jsonl.gz", tmp_path / "j" / KEPT / "vlmtrace-vm-1-1.0.jsonl.gz")

    matrix_keep.keep(matrix, str(tmp_path / "m.json"), str(tmp_path / "g.json"), str(tmp_path / "j"), "291a4ae", {KEPT})
    entries, rows = matrix_keep.load(matrix)
    assert [(entry["id"], entry["committed"]) for entry in entries] == [(KEPT, True), (NOT_KEPT, False)]
    assert [row["graded_at"] for row in rows] == ["291a4ae"] * 2
    assert (matrix / f"{KEPT}.jsonl.gz").read_bytes() == (COMMITTED / f"{KEPT}.jsonl.gz").read_bytes()
    with pytest.raises(SystemExit, match="already committed"):
        matrix_keep.keep(
            matrix, str(tmp_path / "m.json"), str(tmp_path / "g.json"), str(tmp_path / "j"), "291a4ae", set()
        )
    with pytest.raises(SystemExit, match="not in the manifest: elsewhere"):
        matrix_keep.keep(
            matrix, str(tmp_path / "m.json"), str(tmp_path / "g.json"), str(tmp_path / "j"), "291a4ae", {"elsewhere"}
        )


def test_a_row_is_graded_again_only_where_its_grade_changed(tmp_path: Path):
    manifest, results = _entries(KEPT, NOT_KEPT)
    results[0].update(found="-", leak_found=False, class_right=False)  # as an older analyzer graded it
    matrix = _matrix(tmp_path / "matrix", manifest, results)
    shutil.copy(COMMITTED / f"{KEPT}.jsonl.gz", matrix / f"{KEPT}.jsonl.gz")

    assert matrix_keep.regrade(matrix, "291a4ae", []) == [KEPT]
    _, rows = matrix_keep.load(matrix)
    assert (rows[0]["found"], rows[0]["class_right"], rows[0]["graded_at"]) == ("host_growth", True, "291a4ae")
    assert rows[1] == results[1]  # no journal at hand: the grade of the last analyzer that had it
    assert matrix_keep.regrade(matrix, "951fa32", []) == []
