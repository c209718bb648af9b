"""The engine step's cost guard: benchmarks/step_instructions.py counts, with valgrind's callgrind, the
instructions the event-loop thread runs a PyTorch-engine step (LMDeploy's real scheduling code around a
step that does nothing), without vlmtrace and with `instrument()`'s defaults. vlmtrace's excess may not
exceed the committed baseline's by more than 30 %, nor fall under half of it. An instruction count does not
move with other jobs on the host, so the guard holds on a loaded CI machine."""

from __future__ import annotations

import shutil
import sys

import pytest

from tests.support.benchmark_run import REPO, run_benchmark

pytest.importorskip("lmdeploy", reason="the real LMDeploy Python code is needed (scripts/test installs it)")

BASELINE = REPO / "benchmarks" / "results" / "step_instructions_baseline.json"
sys.path.insert(0, str(REPO / "benchmarks"))

from step_instructions import check


@pytest.mark.lmdeploy
@pytest.mark.skipif(shutil.which("callgrind_control") is None, reason="valgrind is not installed")
def test_vlmtrace_adds_no_more_instructions_per_engine_step_than_the_baseline_allows():
    done = run_benchmark("step_instructions.py", "--batches", "30", "--arms", "journal-only", "--check", str(BASELINE))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "within the baseline's bounds" in done.stdout, done.stdout


@pytest.mark.parametrize(
    ("journal_only", "failing"),
    [(82_000, False), (100_000, True), (40_000, True)],
    ids=["as the baseline", "over a third more", "under half: the count missed the step"],
)
def test_a_steps_instruction_excess_outside_the_baselines_bounds_fails_the_check(journal_only: int, failing: bool):
    failures = check({"plain": 32_000, "journal-only": journal_only}, {"journal-only_excess": 50_000}, 0.3)
    assert bool(failures) is failing, failures
