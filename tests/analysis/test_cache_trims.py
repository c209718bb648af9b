"""The cache guard's trims in a trace: measured as the application's empty_cache calls are, kept apart from
them, shown on the report's timeline, and never read as a change in a leak (a trim drops torch's
reserved memory; what tensors hold does not move). LMDeploy's own heap
trims (host memory) are measured the same way, on an H200 recording."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from synthetic import MiB, Scenario

from conftest import GPU_RUNS, analyse, verdict
from vlmtrace import semconv as sc
from vlmtrace.report.html import render_report, write_report

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
RELEASING = {sc.STAGE_CACHE_TRIM, sc.STAGE_EMPTY_CACHE}


def test_trims_are_measured_as_empty_cache_calls_are_and_kept_apart_from_them(journal):
    # The vision forward's activations leave ~100-200 MiB cached after each request: over 64 MiB.
    path, _ = journal(
        Scenario(requests=240, trim_cache_bytes=64 * MiB, trim_interval_s=2.0, output_tokens=(30, 34), seed=3)
    )
    analysis = analyse(path)
    trims, calls = analysis.cache_trims, analysis.empty_cache
    assert calls.calls == 0  # the application made none
    assert 8 <= trims.calls <= 20  # at most one per 2 s over a run of about 20 s
    assert trims.median_duration_s == pytest.approx(0.00395, rel=0.01)
    assert trims.median_released_bytes > 64 * MiB and trims.released_bytes > trims.calls * 64 * MiB
    assert trims.latency_penalty_s == pytest.approx(0.012, rel=0.5)  # the simulated re-allocation after a trim
    assert analysis.summary.to_dict()["cache_trims"]["calls"] == trims.calls


def test_a_tensor_leak_under_the_guard_stays_a_tensor_leak(journal):
    rate = 4 * MiB
    path, _ = journal(
        Scenario(
            requests=240, rates={"tensor": rate}, stages={"tensor": sc.STAGE_ENGINE_STREAM}, trim_cache_bytes=64 * MiB
        )
    )
    analysis = analyse(path)
    assert analysis.cache_trims.calls > 5
    tensor = verdict(analysis, "tensor")
    assert tensor.klass == "tensor_leak" and tensor.stage == sc.STAGE_ENGINE_STREAM
    assert tensor.slope_bytes_per_request == pytest.approx(rate, rel=0.1)
    cache = verdict(analysis, "cache")
    assert cache.klass == "no_growth" and "cache guard's trims" in cache.evidence["plateau_reason"]
    assert [v.klass for v in analysis.summary.verdicts if v.component in ("native", "host")] == ["no_growth"] * 2
    assert not {v.stage for v in analysis.summary.verdicts} & RELEASING
    advice = [r for r in analysis.summary.recommendations if r.cause == "tensor_leak"]
    assert advice and all("trim" not in r.action for r in advice)


def test_a_steady_run_under_the_guard_finds_no_leak_and_no_stage_for_what_trims_released(journal):
    path, _ = journal(Scenario(requests=240, trim_cache_bytes=64 * MiB, seed=5))
    analysis = analyse(path)
    assert analysis.cache_trims.calls > 5
    assert not analysis.summary.leak_found
    cache = verdict(analysis, "cache")
    assert cache.klass == "no_growth" and cache.stage not in RELEASING


def test_the_empty_cache_advice_names_the_guard_or_its_measured_trims(journal):
    rates, stages = {"cache": 8 * MiB}, {"cache": sc.STAGE_VISION_FORWARD}
    unguarded, _ = journal(Scenario(requests=240, rates=rates, stages=stages), name="unguarded.jsonl")
    # A bound the retained cache crosses only near the end: it is still cache retention, with trims measured.
    late, _ = journal(
        Scenario(requests=240, rates=rates, stages=stages, trim_cache_bytes=1950 * MiB, trim_interval_s=30.0),
        name="late.jsonl",
    )
    for path, expected in ((unguarded, "trim_cache='headroom=…'"), (late, "The cache guard trimmed instead: Measured")):
        analysis = analyse(path)
        assert verdict(analysis, "cache").klass == "cache_retention"
        (advice,) = [r for r in analysis.summary.recommendations if "empty_cache" in r.action]
        assert expected in advice.detail
    assert analyse(late).cache_trims.calls >= 1


@pytest.mark.browser
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (apt-get install chromium)")
def test_the_report_marks_each_trim_on_the_timeline_and_states_their_cost(journal, tmp_path: Path):
    playwright = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")
    path, _ = journal(Scenario(requests=120, trim_cache_bytes=64 * MiB, trim_interval_s=1.0, seed=7))
    analysis = analyse(path)
    report = tmp_path / "report.html"
    write_report(analysis, report)
    problems: list[str] = []
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on(
            "console", lambda message: problems.append(message.text) if message.type in ("error", "warning") else None
        )
        page.on("pageerror", lambda error: problems.append(str(error)))
        page.goto(report.as_uri())
        page.wait_for_function("document.querySelectorAll('#chart-timeline .main-svg').length > 0", timeout=30_000)
        drawn = page.evaluate(
            """() => {
                const chart = document.getElementById('chart-timeline');
                const trace = chart.data.find(t => t.name === 'cache trims');
                return {
                    trims: trace ? trace.x.length : 0,
                    points: chart.querySelectorAll('.scatterlayer .trace .points path').length,
                    legend: [...chart.querySelectorAll('.legendtext')].map(t => t.textContent),
                };
            }"""
        )
        text = page.inner_text("#recommendations")
        browser.close()
    assert problems == []
    assert drawn["trims"] == analysis.cache_trims.calls and drawn["points"] >= analysis.cache_trims.calls
    assert "cache trims" in drawn["legend"]
    assert (
        f"{analysis.cache_trims.calls} trims" in text
        and "requests right after a trim took" in text
        and "of all requests' time" in text
    )


def test_a_report_without_trims_has_no_trim_markers_or_section(journal):
    path, _ = journal(Scenario(requests=60))
    page = render_report(analyse(path))
    assert "cache trims" not in page and 'id="cache-trims"' not in page


def test_lmdeploys_heap_trims_recorded_on_the_h200_are_measured_and_stated():
    """A PyTorch-engine run on the H200 (40 prompts a call, 280 requests): LMDeploy trimmed
    its heap twice (`lmdeploy.pytorch.heap_trim`), each stall 0.3-0.4 s on the engine's thread with 40
    requests in flight; the report says what they cost them, and that the fall they leave is no leak ending."""
    analysis = analyse(GPU_RUNS / "pt-host-prompt-40x280-2MiB.jsonl.gz")
    trims = analysis.summary.heap_trims
    assert trims["calls"] == 2 and 0.3 < trims["median_duration_s"] < 0.45
    assert 80 * MiB < trims["median_released_bytes"] < 140 * MiB
    assert trims["requests_after"] == 58 and trims["latency_after_s"] > 1.4 * trims["latency_other_s"]
    assert analysis.summary.cache_trims["calls"] == 0  # measured apart from the cache guard's trims
    page = render_report(analysis)
    assert (
        'id="heap-trims"' in page
        and "ran a full <code>gc.collect()</code> and <code>malloc_trim(0)</code> 2 times" in page
    )
    assert "requests in flight during a trim took" in page
