"""The per-request budget's guard: benchmarks/request_budget.py's short form on LMDeploy 0.18's real
pipeline over the stand-in TurboMind engine.

What vlmtrace adds to the event loop's CPU per request, as a fraction of the same pipeline's CPU without
it in the same run, may not exceed the committed baseline's by more than 30 % (the rounds of `infer` and
`stream_infer` pooled; an engine step's cost is guarded in instructions, test_step_instructions.py). The
same run burns a known extra cost on every request in an `injected` arm, twice the baseline's excess: the guard has to flag it, so a check that cannot fail would fail here. The
allowance is measured from the baseline, not from this run, so the injection is sized to cross it
wherever this run's own excess lies between none and the baseline's."""

from __future__ import annotations

import json

import pytest

from tests.support.benchmark_run import REPO, run_benchmark

pytest.importorskip("lmdeploy", reason="the real LMDeploy Python code is needed (scripts/test installs it)")

BASELINE = REPO / "benchmarks" / "results" / "request_budget_baseline.json"


@pytest.mark.lmdeploy
def test_vlmtrace_adds_no_more_event_loop_cpu_per_request_than_the_baseline_allows(tmp_path):
    result_path = tmp_path / "budget.json"
    done = run_benchmark(
        "request_budget.py",
        "--short",
        "--part",
        "requests",
        "--check",
        str(BASELINE),
        "--inject",
        "2.0",
        "--json",
        str(result_path),
    )
    assert result_path.exists(), done.stderr[-3000:]
    result = json.loads(result_path.read_text())
    assert result["check"]["injected_caught"], result["check"]
    assert done.returncode == 0, "\n".join(result["check"]["failures"]) + "\n" + done.stdout[-3000:]
