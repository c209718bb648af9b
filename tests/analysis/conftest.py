"""Shared helpers: synthetic journals on disk, and reading + analysing them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from synthetic import Scenario, Truth, write_journal

from vlmtrace.analysis.pipeline import Analysis, analyze
from vlmtrace.analysis.readers.detect import read_inputs

DATA = Path(__file__).parent / "data" / "formats"
# Journals recorded with a known cause, rate and stage, on the GPU and on the CPU (benchmarks/gpu_matrix.py,
# benchmarks/cpu_matrix.py), with their grades.
GPU_RUNS = Path(__file__).parent / "data" / "gpu" / "matrix"
CPU_RUNS = Path(__file__).parent / "data" / "cpu_matrix"
SHARED_FORMATS = Path(__file__).resolve().parents[2].parent / "shared" / "formats"


@pytest.fixture
def journal(tmp_path: Path) -> Callable[..., tuple[Path, Truth]]:
    def make(scenario: Scenario, name: str = "run.jsonl", compress: bool = False) -> tuple[Path, Truth]:
        path = tmp_path / name
        return path, write_journal(scenario, path, compress=compress)

    return make


def analyse(*paths: Path | str) -> Analysis:
    return analyze(read_inputs([str(path) for path in paths]))


def verdict(analysis: Analysis, component: str):
    (found,) = [v for v in analysis.summary.verdicts if v.component == component]
    return found
