"""Open a generated report in headless Chromium, offline: no console errors, charts drawn, no injected script run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import analyse
from synthetic import HOSTILE, MiB, Scenario

from vlmtrace import semconv as sc
from vlmtrace.report.html import write_report

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
playwright = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (apt-get install chromium)"),
]


def test_report_renders_offline_without_errors_or_injected_scripts(journal, tmp_path: Path):
    scenario = Scenario(
        requests=80, batch=2, crash_at_request=70, hostile=True, host=HOSTILE, continuous_sizes=True,
        rates={"cache": 8 * MiB, "host": 2 * MiB}, stages={"cache": sc.STAGE_VISION_FORWARD, "host": sc.STAGE_VISION_PREPROCESS},
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
        page.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:") else (outside.append(route.request.url), route.abort()))
        page.on("console", lambda message: problems.append(message.text) if message.type in ("error", "warning") else None)
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
