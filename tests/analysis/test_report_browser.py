"""Open a generated report in headless Chromium, offline: no console errors, charts drawn, no injected script run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from synthetic import HOSTILE, MiB, Scenario

from conftest import analyse
from vlmtrace import semconv as sc
from vlmtrace.report.html import write_report

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
playwright = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (apt-get install chromium)"
    ),
]


def test_report_renders_offline_without_errors_or_injected_scripts(journal, tmp_path: Path):
    scenario = Scenario(
        requests=80,
        batch=2,
        crash_at_request=70,
        hostile=True,
        host=HOSTILE,
        continuous_sizes=True,
        rates={"cache": 8 * MiB, "host": 2 * MiB},
        stages={"cache": sc.STAGE_VISION_FORWARD, "host": sc.STAGE_VISION_PREPROCESS},
    )
    path, _ = journal(scenario)
    report = tmp_path / "report.html"
    write_report(analyse(path), report)
    problems: list[str] = []
    outside: list[str] = []
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
        )
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.route(
            "**/*",
            lambda route: (
                route.continue_()
                if route.request.url.startswith("file:")
                else (outside.append(route.request.url), route.abort())
            ),
        )
        page.on(
            "console", lambda message: problems.append(message.text) if message.type in ("error", "warning") else None
        )
        page.on("pageerror", lambda error: problems.append(str(error)))
        page.on("dialog", lambda dialog: (problems.append(f"dialog: {dialog.message}"), dialog.dismiss()))
        page.goto(report.as_uri())
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 6", timeout=30_000)
        drawn = page.evaluate(
            "['timeline', 'growth', 'features'].map(id => document.querySelectorAll('#chart-' + id + ' .main-svg').length)"
        )
        pwned = page.evaluate("window.__pwned")
        headline = page.inner_text("#verdict .headline")
        browser.close()
    assert problems == [] and outside == []
    assert all(count > 0 for count in drawn)
    assert pwned is None
    assert "in flight" in headline


GPU = Path(__file__).parent / "data" / "gpu"
# The H200 crash report was 12 170 px tall before in-flight chains and thread stacks were grouped.
MAX_CRASH_REPORT_PX = 7500


@pytest.mark.parametrize("width", [390, 1366])  # a phone, a laptop
def test_reports_fit_the_window_and_the_crash_chart_marks_the_stop(tmp_path: Path, width: int):
    crash, leak = tmp_path / "crash.html", tmp_path / "leak.html"
    write_report(analyse(GPU / "turbomind-crash.jsonl.gz"), crash)
    write_report(analyse(GPU / "turbomind-tensor.jsonl.gz"), leak)
    measured = {}
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        for report in (crash, leak):
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.goto(report.as_uri())
            page.wait_for_function("document.querySelectorAll('#chart-timeline .main-svg').length > 0", timeout=30_000)
            measured[report.stem] = page.evaluate(
                """() => ({
                    page: [document.documentElement.scrollWidth, document.documentElement.clientWidth],
                    height: document.documentElement.scrollHeight,
                    sections: [...document.querySelectorAll('section')].filter(s => s.scrollWidth > s.clientWidth).map(s => s.id),
                    marker: [...document.querySelectorAll('#chart-timeline .annotation-text')].map(a => a.textContent),
                    grouped: [...document.querySelectorAll('#crash p')].map(p => p.textContent).filter(t => /threads with this stack|chains like this one/.test(t)).length,
                    wider: [...document.querySelectorAll('main *')].filter(e => e.getBoundingClientRect().right > document.documentElement.clientWidth + 1 && !e.closest('table:not(.stack)')).map(e => e.tagName + ' ' + e.textContent.slice(0, 40)),
                    slight: [...document.querySelectorAll('#components td.cls')].filter(td => td.textContent.startsWith('Slight growth')).map(td => getComputedStyle(td).color),
                    ink: getComputedStyle(document.body).color,
                    completed: document.querySelector('#verdict .facts b').textContent,
                    sub: [...document.querySelectorAll('#verdict p.sub')].map(p => p.textContent),
                })"""
            )
            page.screenshot(path=str(tmp_path / f"{report.stem}-{width}.png"), full_page=True)
        browser.close()
    for name, facts in measured.items():
        scroll, client = facts["page"]
        assert scroll <= client, f"{name} at {width} px overflows horizontally"
        assert facts["sections"] == [], f"{name} at {width} px: these sections scroll sideways"
        assert facts["wider"] == [], (
            f"{name} at {width} px: wider than the window (only a wide table may scroll, inside itself)"
        )
    assert measured["crash"]["marker"] == ["process stopped"] and measured["leak"]["marker"] == []
    assert measured["crash"]["grouped"] >= 2
    assert measured["crash"]["height"] < MAX_CRASH_REPORT_PX * (3 if width < 600 else 1)  # a phone stacks the tables
    # growth below the reporting threshold is not a leak: written in the page's ink, not the leak's red
    assert measured["leak"]["slight"] and set(measured["leak"]["slight"]) == {measured["leak"]["ink"]}
    # the requests the headline counts are the requests the facts count
    assert f"over {measured['crash']['completed']} requests" in " ".join(measured["crash"]["sub"])


def test_diff_page_draws_both_runs_offline_without_errors(tmp_path: Path):
    from vlmtrace.analysis.compare import compare
    from vlmtrace.report.diff_html import write_diff

    page_path = tmp_path / "diff.html"
    write_diff(compare(analyse(GPU / "turbomind-none.jsonl.gz"), analyse(GPU / "turbomind-tensor.jsonl.gz")), page_path)
    problems: list[str] = []
    outside: list[str] = []
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
        )
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.route(
            "**/*",
            lambda route: (
                route.continue_()
                if route.request.url.startswith("file:")
                else (outside.append(route.request.url), route.abort())
            ),
        )
        page.on(
            "console", lambda message: problems.append(message.text) if message.type in ("error", "warning") else None
        )
        page.on("pageerror", lambda error: problems.append(str(error)))
        page.goto(page_path.as_uri())
        page.wait_for_function("document.querySelectorAll('#chart-comparison .main-svg').length > 0", timeout=30_000)
        drawn = page.evaluate(
            """() => ({
                legend: [...document.querySelectorAll('#chart-comparison .legendtext')].map(t => t.textContent),
                titles: [...document.querySelectorAll('#chart-comparison .annotation-text')].map(t => t.textContent),
                lines: document.querySelectorAll('#chart-comparison .scatterlayer .trace').length,
            })"""
        )
        headline = page.inner_text("#verdict .headline")
        browser.close()
    assert problems == [] and outside == []
    assert drawn["legend"] == ["before", "after"]
    assert "torch tensors (allocated) — regressed" in drawn["titles"] and len(drawn["titles"]) == 4
    assert drawn["lines"] == 4 * 2 * 2  # per component: each run's levels and its fit
    assert headline.startswith("torch tensors (allocated): regressed")
