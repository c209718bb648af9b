"""The PyTorch engine's decode steps recorded as runs (one span per run of them, docs/schema.md): the
committed PyTorch journals recorded with a span per step are rewritten as decode runs would have recorded
them and must grade as in the table (test_graded_gpu_runs.py grades the journals as they were)."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

from conftest import GPU_RUNS, analyse
from vlmtrace import semconv as sc

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import gpu_matrix

ENTRIES = {entry["id"]: entry for entry in json.loads((GPU_RUNS / "manifest.json").read_text())}
RESULTS = {row["id"]: row for row in json.loads((GPU_RUNS / "results.json").read_text())}


def _recorded_per_step(identifier: str) -> bool:
    """Whether the journal's decode steps are one span each: its first decode step's end has no step count."""
    with gzip.open(GPU_RUNS / f"{identifier}.jsonl.gz", "rt") as journal:
        for line in journal:
            if sc.SPAN_PYTORCH_FORWARD in line and sc.STEP_KIND in line:
                record = json.loads(line)
                if record["k"] == "end" and record["attrs"].get(sc.STEP_KIND) == "decode":
                    return sc.STEP_COUNT not in record["attrs"]
    return False


PYTORCH = sorted(
    identifier
    for identifier, entry in ENTRIES.items()
    if entry["committed"] and entry["backend"] == "pytorch" and _recorded_per_step(identifier)
)
RUN_BOUND_NS = 100_000_000  # pytorch_decode_runs.RUN_BOUND_NS
IDLE_GAP_NS = 10_000_000  # a longer gap between two decode steps: the engine was idle between them


def as_decode_runs(records: list[dict]) -> list[dict]:
    """The records with consecutive decode steps merged: a run ends at a prefill step, an idle gap, or
    the first step end past the bound; it has its first step's start record and attributes, its last
    step's end time and reading (written where that step's end was), the first step's start reading,
    and the count of steps. The readings of the steps in between are gone, as they are not taken."""
    ends = {r["span_id"]: r for r in records if r["k"] == "end"}
    merged: set[str] = set()  # steps inside a run, after its first
    run_end: dict[str, dict] = {}  # a run's last step → the run's end record
    run: list | None = None  # [first step's start record, last step's end record, steps]

    def close() -> None:
        nonlocal run
        if run is not None:
            first, last, steps = run
            end = dict(ends[first["span_id"]], t=last["t"], mem=last["mem"])
            end["mem0"] = ends[first["span_id"]].get("mem0", ends[first["span_id"]]["mem"])
            end["attrs"] = {**end["attrs"], sc.STEP_COUNT: steps}
            run_end[last["span_id"]] = end
            run = None

    for start in (r for r in records if r["k"] == "start" and r["name"] == sc.SPAN_PYTORCH_FORWARD):
        end = ends.get(start["span_id"])
        if start["attrs"].get(sc.STEP_KIND) != "decode" or end is None:
            close()
            continue
        if run is not None and start["t"] - run[1]["t"] > IDLE_GAP_NS:
            close()
        if run is None:
            run = [start, end, 1]
        else:
            merged.add(start["span_id"])
            run[1:] = [end, run[2] + 1]
        if end["t"] - run[0]["t"] >= RUN_BOUND_NS:
            close()
    close()
    firsts = {end["span_id"] for end in run_end.values()}
    rewritten = []
    for record in records:
        span_id = record.get("span_id")
        if record["k"] == "end" and span_id in run_end:
            rewritten.append(run_end[span_id])
        elif span_id in merged or (record["k"] == "end" and span_id in firsts):
            continue
        else:
            rewritten.append(record)
    return rewritten


@pytest.mark.parametrize("identifier", PYTORCH)
def test_a_recorded_pytorch_scenario_rewritten_as_decode_runs_grades_as_in_the_table(identifier: str, tmp_path):
    with gzip.open(GPU_RUNS / f"{identifier}.jsonl.gz", "rt") as journal:
        records = [json.loads(line) for line in journal if line.strip()]
    rewritten = as_decode_runs(records)
    steps = [r for r in rewritten if r["k"] == "end" and r["name"] == sc.SPAN_PYTORCH_FORWARD]
    decode_steps = sum(1 for r in records if r["k"] == "end" and r["attrs"].get(sc.STEP_KIND) == "decode")
    assert sum(r["attrs"].get(sc.STEP_COUNT, 0) for r in steps) == decode_steps
    assert len(steps) < len([r for r in records if r["k"] == "end" and r["name"] == sc.SPAN_PYTORCH_FORWARD]) / 3
    path = tmp_path / "runs.jsonl.gz"
    with gzip.open(path, "wt") as journal:
        journal.writelines(json.dumps(record) + "\n" for record in rewritten)
    row = gpu_matrix.grade(ENTRIES[identifier], analyse(path).summary)
    recorded = RESULTS[identifier]
    assert {key: row[key] for key in ("found", "class_right", "stage_found", "stage_right", "slope_right")} == {
        key: recorded[key] for key in ("found", "class_right", "stage_found", "stage_right", "slope_right")
    }
