"""`vlmtrace diff`: two runs through the real readers and analyzer, a verdict per component, exit codes for CI.

The regressed/fixed pairs are real H200 journals (tests/analysis/data/gpu/README.md): the same TurboMind
workload with and without an injected 4 MiB-per-image tensor leak, and two runs of the PyTorch-engine
matrix (a 1 MiB-per-request tensor leak; a plain run whose host memory is still warming up).
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from synthetic import MiB, Scenario, journal_to_otlp
from typer.testing import CliRunner

from conftest import analyse
from vlmtrace import semconv as sc
from vlmtrace.analysis.compare import FIXED, INCONCLUSIVE, REGRESSED, UNCHANGED, compare
from vlmtrace.cli.main import app

GPU = Path(__file__).parent / "data" / "gpu"
CLEAN, LEAKING = GPU / "turbomind-none.jsonl.gz", GPU / "turbomind-tensor.jsonl.gz"
MATRIX_LEAK, MATRIX_WARMUP = (
    GPU / "matrix" / "pt-tensor-engine-8x60-1MiB.jsonl.gz",
    GPU / "matrix" / "pt-warmup-1x60.jsonl.gz",
)
runner = CliRunner()


def _verdicts(before: Path, after: Path) -> dict[str, str]:
    return {change.component: change.verdict for change in compare(analyse(before), analyse(after)).changes}


def _diff(tmp_path: Path, before: Path | str, after: Path | str, *options: str):
    return runner.invoke(
        app,
        ["diff", str(before), str(after), "-o", str(tmp_path / "d.html"), "--json", str(tmp_path / "d.json"), *options],
    )


def test_a_leak_introduced_is_regressed_and_removed_is_fixed_on_h200_journals():
    assert _verdicts(CLEAN, LEAKING) == {
        "tensor": REGRESSED,
        "cache": UNCHANGED,
        "native": UNCHANGED,
        "host": UNCHANGED,
    }
    assert _verdicts(LEAKING, CLEAN)["tensor"] == FIXED


def test_host_intervals_disjoint_by_less_than_the_threshold_are_unchanged():
    """Host memory: +50 KiB/request [33, 69] against +19 [13, 23]: disjoint, but 31 KiB × 161 requests is
    under MIN_GROWTH_BYTES, so no verdict is drawn from it."""
    (host,) = [c for c in compare(analyse(CLEAN), analyse(LEAKING)).changes if c.component == "host"]
    assert host.after.high < host.before.low
    assert host.verdict == UNCHANGED and "less than 8 MiB" in host.reason


def test_a_run_the_analyzer_cannot_settle_makes_its_component_inconclusive():
    changes = {c.component: c for c in compare(analyse(MATRIX_LEAK), analyse(MATRIX_WARMUP)).changes}
    assert changes["tensor"].verdict == FIXED
    assert changes["host"].after.klass == "inconclusive" and changes["host"].verdict == INCONCLUSIVE


def test_the_same_leak_in_both_runs_is_unchanged_and_a_slower_leak_is_not_called_fixed(journal):
    cause = {"rates": {"tensor": 4 * MiB}, "stages": {"tensor": sc.STAGE_VISION_PREPROCESS}}
    first, _ = journal(Scenario(requests=120, seed=1, **cause), name="a.jsonl")
    second, _ = journal(Scenario(requests=120, seed=2, **cause), name="b.jsonl")
    slower, _ = journal(
        Scenario(requests=120, seed=3, rates={"tensor": 1 * MiB}, stages=cause["stages"]), name="c.jsonl"
    )
    same = compare(analyse(first), analyse(second))
    assert {c.component: c.verdict for c in same.changes}["tensor"] == UNCHANGED and not same.regressed
    (tensor,) = [c for c in compare(analyse(first), analyse(slower)).changes if c.component == "tensor"]
    assert tensor.after.leaks and tensor.verdict == INCONCLUSIVE and "still a leak" in tensor.reason


def test_cli_fails_on_regression_only_when_asked_and_only_for_a_regression(tmp_path: Path):
    regressed = _diff(tmp_path, CLEAN, LEAKING, "--fail-on-regression")
    assert regressed.exit_code == 1, regressed.output
    assert "regressed" in regressed.output and "+4.00 MiB" in regressed.output
    summary = orjson.loads((tmp_path / "d.json").read_bytes())
    assert summary["regressed"] is True and summary["schema"] == "vlmtrace.diff/1"
    (tensor,) = [c for c in summary["changes"] if c["component"] == "tensor"]
    assert (
        tensor["after"]["slope_bytes_per_request"] == 4 * MiB and tensor["after"]["stage"] == sc.STAGE_VISION_PREPROCESS
    )
    assert (
        tensor["before"]["slope_interval_bytes_per_request"][1] < tensor["after"]["slope_interval_bytes_per_request"][0]
    )
    assert (tmp_path / "d.html").read_text().startswith("<!DOCTYPE html>")
    assert _diff(tmp_path, CLEAN, LEAKING).exit_code == 0
    assert _diff(tmp_path, LEAKING, CLEAN, "--fail-on-regression").exit_code == 0


def test_runs_in_different_formats_compare(tmp_path: Path, journal):
    """A journal before, the same kind of run exported through OTLP after: both read, no regression."""
    before, _ = journal(Scenario(requests=80, seed=4), name="before.jsonl")
    after_journal, _ = journal(Scenario(requests=80, seed=5), name="after.jsonl")
    journal_to_otlp(after_journal, tmp_path / "after.otlp.json")
    result = _diff(tmp_path, before, tmp_path / "after.otlp.json", "--fail-on-regression")
    assert result.exit_code == 0, result.output
    summary = orjson.loads((tmp_path / "d.json").read_bytes())
    assert summary["runs"]["after"]["inputs"] == [str(tmp_path / "after.otlp.json")]
    assert {c["verdict"] for c in summary["changes"]} <= {UNCHANGED, INCONCLUSIVE}


@pytest.mark.parametrize("which", ["before", "after"])
def test_a_run_with_nothing_readable_exits_2_without_traceback(tmp_path: Path, journal, which: str):
    good, _ = journal(Scenario(requests=20))
    runs = {"before": good, "after": good, which: tmp_path / "missing.jsonl"}
    result = _diff(tmp_path, runs["before"], runs["after"], "--fail-on-regression")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "missing.jsonl" in result.output


def test_an_output_naming_an_input_is_refused(tmp_path: Path, journal):
    path, _ = journal(Scenario(requests=20))
    before = path.read_bytes()
    result = runner.invoke(app, ["diff", str(path), str(path), "-o", str(path)])
    assert result.exit_code == 2 and "it is one of the inputs" in result.output
    assert path.read_bytes() == before


def test_runs_too_short_to_fit_say_so(tmp_path: Path):
    """The H200 api_server run holds four requests: no slope to compare, said in words, not an empty table."""
    run = GPU / "api-server" / "journal"
    result = _diff(tmp_path, run, run, "--fail-on-regression")
    assert result.exit_code == 0, result.output
    assert "Nothing to compare" in result.output and "Nothing to compare" in (tmp_path / "d.html").read_text()
    assert orjson.loads((tmp_path / "d.json").read_bytes())["changes"] == []


def test_a_run_read_from_its_heap_allocations_is_compared_by_resident_memory_with_one_that_was_not(tmp_path: Path):
    """The same recorded run with and without the heap counter's charges by allocating stage: its host rate
    is 0.507 MiB a request from the stream's chunks (a narrow interval) and 0.596 from resident memory. Set
    against each other those intervals are disjoint, and the run would be called regressed against itself."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import cpu_matrix

    charged = Path(__file__).parent / "data" / "cpu_matrix" / "cpu-tm-host-engine-16x112-0.5MiB-heap"
    resident = tmp_path / "resident"
    cpu_matrix._without_heap_stages(str(charged), str(resident))
    for before, after in ((charged, resident), (resident, charged)):
        host = next(c for c in compare(analyse(before), analyse(after)).changes if c.component == "host")
        assert host.verdict == UNCHANGED, host.reason
        assert "resident memory in both runs" in host.reason
        assert host.before.slope > 0.55 * MiB and host.after.slope > 0.55 * MiB
