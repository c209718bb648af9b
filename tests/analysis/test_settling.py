"""Growth that is not a leak (warm-up, a one-off step) is not called one, a short run says it cannot
tell yet, a real leak is still found early, and a verdict's label never contradicts its interval."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from synthetic import MiB, Scenario
from typer.testing import CliRunner

from conftest import GPU_RUNS, analyse, verdict
from vlmtrace import semconv as sc
from vlmtrace.analysis.registry import BELOW_THRESHOLD, INCONCLUSIVE, NO_GROWTH
from vlmtrace.analysis.robust import theil_sen
from vlmtrace.analysis.step2_preparing.settle import SettledSeries
from vlmtrace.analysis.step3_verdict.leaks import component_growth
from vlmtrace.analysis.step3_verdict.rise_shapes import steadiness
from vlmtrace.analysis.wording import verdict_sentence
from vlmtrace.cli.main import app

# LMDeploy's own warm-up as measured on the H200 (docs/gpu.md): host memory grows by hundreds of
# KiB per request at first and less and less after.
WARMUP = {"host": 700 * 1024}


def test_warm_up_over_a_short_run_is_inconclusive_and_says_how_long_to_run(journal, tmp_path: Path):
    path, _ = journal(Scenario(requests=120, warmup=WARMUP, warmup_half_life=40))
    analysis = analyse(path)
    host = verdict(analysis, "host")
    assert host.klass == INCONCLUSIVE and not analysis.summary.leak_found
    assert host.slope_interval_bytes_per_request[0] > 0  # it does rise: so it is not called "no growth"
    assert "more requests would settle it" in host.evidence["inconclusive_reason"]
    result = CliRunner().invoke(app, ["report", str(path), "-o", str(tmp_path / "r.html"), "--fail-on-leak"])
    assert result.exit_code == 0, result.output
    assert "inconclusive" in result.output


def test_the_same_warm_up_over_a_long_run_is_no_leak(journal):
    path, _ = journal(Scenario(requests=600, warmup=WARMUP, warmup_half_life=40))
    analysis = analyse(path)
    assert not analysis.summary.leak_found
    assert verdict(analysis, "host").klass in (NO_GROWTH, BELOW_THRESHOLD)


def test_a_steady_half_mib_per_request_is_a_leak_within_120_requests(journal):
    """The caution costs no real leak on the GPU: 0.5 MiB per request is found within 120 requests."""
    scenario = Scenario(
        requests=120, rates={"tensor": 0.5 * MiB}, stages={"tensor": sc.STAGE_ENGINE_STREAM}, warmup=WARMUP
    )
    assert verdict(analyse(journal(scenario)[0]), "tensor").klass == "tensor_leak"


def test_host_growth_in_a_young_process_waits_for_its_warm_up(journal):
    """A fresh process of LMDeploy's PyTorch engine raises its host memory by up to ~1 MiB per request
    over its first requests: a smaller host rise there is inconclusive, and called a leak once the process
    is past its warm-up (the class past 160 requests, the stage past 200). TurboMind's host warm-up is ~45 KiB per request: there it is a leak at once."""

    def host(requests: int, backend: str):
        scenario = Scenario(
            requests=requests,
            rates={"host": 0.5 * MiB},
            stages={"host": sc.STAGE_VISION_PREPROCESS},
            warmup=WARMUP,
            backend=backend,
        )
        return verdict(analyse(journal(scenario, name=f"run-{backend}-{requests}.jsonl")[0]), "host")

    young = host(120, "pytorch")
    assert young.klass == INCONCLUSIVE and "warm-up" in young.evidence["inconclusive_reason"]
    assert young.stage is None
    # Past 160 requests the run's halves tell a leak from the warm-up; its stage waits until 200, since
    # the warm-up's stages hold as much in a process this young.
    past_class_window = host(180, "pytorch")
    assert past_class_window.klass == "host_growth" and past_class_window.stage is None
    assert "so would LMDeploy's own warm-up" in past_class_window.evidence["stage_uncertain"]
    grown = host(400, "pytorch")
    assert grown.klass == "host_growth" and grown.stage == sc.STAGE_VISION_PREPROCESS
    assert host(120, "turbomind").klass == "host_growth"


def test_a_one_off_step_is_not_a_leak(journal):
    path, _ = journal(Scenario(requests=120, step=("tensor", 40, 256 * MiB)))
    analysis = analyse(path)
    assert not analysis.summary.leak_found
    assert verdict(analysis, "tensor").klass == NO_GROWTH


@pytest.mark.parametrize(
    "scenario",
    [
        Scenario(requests=120, warmup=WARMUP),
        Scenario(requests=600, warmup=WARMUP),
        Scenario(requests=240, step=("tensor", 80, 256 * MiB)),
        Scenario(requests=240, batch=3, continuous_sizes=True, seed=1),
        Scenario(requests=240, rates={"host": 20 * 1024}, stages={"host": sc.STAGE_VISION_PREPROCESS}),
    ],
    ids=["warm-up 120", "warm-up 600", "step", "high-water mark", "slight growth"],
)
def test_no_growth_never_stands_beside_an_interval_that_excludes_zero(journal, scenario):
    for found in analyse(journal(scenario)[0]).summary.verdicts:
        low, high = found.slope_interval_bytes_per_request
        if found.klass == NO_GROWTH and not found.plateau:
            assert low <= 0 <= high, (found.component, low, high)
        if found.klass == BELOW_THRESHOLD:
            assert low > 0


def test_prompt_processing_has_its_stage_from_the_reading_where_it_ends(journal):
    scenario = Scenario(
        requests=240, rates={"tensor": 2 * MiB}, stages={"tensor": sc.STAGE_PROMPT}, prompt_end_readings=True
    )
    found = verdict(analyse(journal(scenario)[0]), "tensor")
    assert (found.klass, found.stage) == ("tensor_leak", sc.STAGE_PROMPT)
    assert found.evidence["stage_share"] > 0.9


def _settled(x: np.ndarray, in_flight: float) -> SettledSeries:
    """Levels read under load at requests `x`, every request of the same input (no new input maxima)."""
    features = pd.DataFrame({"image_pixels_max": np.full(len(x), 1e5), "images_max": 1.0, "input_tokens_max": 100.0})
    return SettledSeries("load", np.arange(len(x)), x, (x * 1e8).astype(np.int64), features, in_flight)


def _heap_sawtooth(kept_per_request: float) -> tuple[np.ndarray, SettledSeries]:
    """A fresh PyTorch-engine process's host level at 16 in flight, as on the H200 (`pt-step-16x240`):
    glibc's heap grows ~0.45 MiB a request, is trimmed once, and grows again; plus
    whatever a leak keeps."""
    x = np.arange(16.0, 241.0, 8.0)
    working = np.where(x < 128, 0.45 * MiB * (x - 16), -4 * MiB + 0.8 * MiB * (x - 128))
    levels = 1e9 + working + kept_per_request * (x - 16)
    return levels, _settled(x, in_flight=16.0)


def test_a_rise_given_back_to_where_it_began_is_not_a_leak():
    levels, series = _heap_sawtooth(kept_per_request=0.0)
    found = component_growth(0, "host", levels, series)
    assert found.per_request.low > 0  # the fit alone rises
    assert found.klass == INCONCLUSIVE and "fell back" in found.inconclusive_reason
    assert "below where it began" in found.inconclusive_reason


def test_a_leak_under_the_same_heap_trim_keeps_what_it_leaked():
    levels, series = _heap_sawtooth(kept_per_request=0.5 * MiB)
    assert component_growth(0, "host", levels, series).klass == "host_growth"


def test_a_stage_rising_beside_a_heap_given_back_is_not_a_leak():
    """`pt-none-16x260`: engine.forward's own charges rose steadily while the process's
    level was trimmed back below its start; what a stage keeps, the process's level keeps too."""
    levels, series = _heap_sawtooth(kept_per_request=0.0)
    stage_levels = 0.35 * MiB * (series.x - series.x[0])
    found = component_growth(
        0,
        "host",
        levels,
        series,
        young_host_warmup=True,
        stage_fit=theil_sen(series.x, stage_levels),
        stage_levels=stage_levels,
    )
    assert found.beside_warmup and found.klass == INCONCLUSIVE and "fell back" in found.inconclusive_reason


def test_a_leak_under_a_heap_trimmed_twice_has_the_rate_it_keeps():
    """As `pt-host-prompt-8x280-0.5MiB` (8 in flight): between trims the level also holds
    the heap's working set (~0.5 MiB a request, given back every ~128 requests): the fit through every
    level reads leak and working set together, the lowest levels after the trims read what is kept."""
    x = np.arange(16.0, 281.0, 8.0)
    working = 0.5 * MiB * ((x - 16) % 128)
    levels = 1e9 + working + 0.5 * MiB * (x - 16)
    series = _settled(x, in_flight=8.0)
    found = component_growth(0, "host", levels, series)
    assert found.klass == "host_growth" and found.trims == 2
    assert abs(found.per_request.slope - 0.5 * MiB) <= 0.05 * MiB
    assert found.per_request.low > 0 and found.per_request.low <= found.per_request.slope <= found.per_request.high
    assert theil_sen(x, levels).slope > 0.6 * MiB  # what the fit alone says


def test_one_trim_is_enough_the_first_level_holds_no_working_set_yet():
    """A run of 220 requests, LMDeploy's heap trim once (request 128): the line from the first level
    through the lowest level after the trim reads what is kept, where the fit reads the working set too."""
    x = np.arange(16.0, 221.0, 8.0)
    working = 0.5 * MiB * ((x - 16) % 112)  # given back at request 128
    levels = 1e9 + working + 0.5 * MiB * (x - 16)
    series = _settled(x, in_flight=8.0)
    found = component_growth(0, "host", levels, series)
    assert found.klass == "host_growth" and found.trims == 1
    assert abs(found.per_request.slope - 0.5 * MiB) <= 0.05 * MiB
    assert theil_sen(x, levels).slope > 0.6 * MiB  # what the fit alone says


def _trimmed_twice(kept_per_request: float) -> tuple[np.ndarray, SettledSeries]:
    """As `pt-host-vision.forward-1x280-0.5MiB` (one in flight): LMDeploy trims the heap
    after requests 128 and 256; the working set builds up at 0.8 MiB a request before the first trim (the
    process's own warm-up with it) and at 0.2 after, so the levels' second half rises at less than half
    the first's rate, whatever is kept."""
    x = np.arange(1.0, 281.0)
    since = (x - 1) % 128
    working = np.where(x <= 128, 0.8 * MiB * since, 0.2 * MiB * since)
    levels = 1e9 + working + kept_per_request * (x - 1)
    return levels, _settled(x, in_flight=1.0)


def test_what_is_kept_across_two_trims_decides_whether_a_rise_is_steady():
    """The halves of the levels read the working set's saw-tooth; what the troughs kept is the leak."""
    levels, series = _trimmed_twice(kept_per_request=0.5 * MiB)
    found = component_growth(0, "host", levels, series)
    assert found.klass == "host_growth" and found.trims == 2
    assert abs(found.per_request.slope - 0.5 * MiB) <= 0.05 * MiB
    assert steadiness(series.x[14:], levels[14:]) is not None  # what the halves alone say
    # Nothing kept: the saw-tooth alone is no leak, whatever its halves say.
    levels, series = _trimmed_twice(kept_per_request=0.0)
    assert component_growth(0, "host", levels, series).klass != "host_growth"
    # Kept at a slowing rate (0.5 MiB a request, then 0.1): warm-up, not yet a leak.
    levels, series = _trimmed_twice(kept_per_request=0.0)
    levels = levels + np.where(series.x < 129, 0.5 * MiB * (series.x - 1), 64 * MiB + 0.1 * MiB * (series.x - 129))
    assert component_growth(0, "host", levels, series).klass == INCONCLUSIVE


def test_the_report_says_when_the_rate_was_read_across_the_heaps_trims():
    """LMDeploy's heap trims at requests 128, 256, 384 and 512 (16 in flight): the rate
    from the lowest level after each trim, 0.53 MiB per request for 0.5."""
    summary = analyse(GPU_RUNS / "pt-host-prompt-16x600-0.5MiB.jsonl.gz").summary
    host = next(found for found in summary.verdicts if found.component == "host")
    assert host.klass == "host_growth" and abs(host.slope_bytes_per_request - 0.5 * MiB) <= 0.05 * MiB
    assert "trimmed 4 times: the rate is what the lowest levels after the trims kept" in verdict_sentence(host, summary)


def test_a_stage_whose_resident_size_rose_in_few_calls_is_not_named():
    """A 0.5 MiB-per-request heap leak in engine.forward at one prompt in flight: the
    resident size rose where the heap next needed fresh pages, in vision.preprocess at its larger images,
    and stood still there in about half the calls; the same leak at 1 MiB is named where it is."""
    small = verdict(analyse(GPU_RUNS / "pt-host-engine-1x240-0.5MiB.jsonl.gz"), "host")
    assert small.klass == "host_growth" and small.stage is None
    assert small.evidence["stage_uncertain"].startswith(
        "vision.preprocess holds most of it, but its resident size did not move"
    )
    assert verdict(analyse(GPU_RUNS / "pt-host-engine-1x120-1MiB.jsonl.gz"), "host").stage == sc.STAGE_ENGINE_FORWARD
