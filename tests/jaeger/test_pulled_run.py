"""A run of LMDeploy's real pipeline on the CPU stand-in (benchmarks/cpu_matrix.py): 120 requests one at a
time, each keeping 0.5 MiB of host memory in its vision preprocessing, exported over OTLP to a real Jaeger.
Pulled back with `vlmtrace report --jaeger`'s defaults, every trace is read and the verdict is the journal's;
with a small --limit the report says it read a sample; cut short by its byte budget, it exits 2 with the counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from tests.jaeger.conftest import ALL_TIME, v3_span_count
from tests.support.journal_replay import journal_spans
from vlmtrace.analysis.readers import remote
from vlmtrace.cli.main import app

pytest.importorskip("lmdeploy", reason="the real LMDeploy Python code is needed (scripts/test installs it)")
pytestmark = [pytest.mark.lmdeploy, pytest.mark.jaeger]

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCENARIO = "cpu-tm-host-vision.preprocess-1x120-0.5MiB"
SERVICE = "tiny-vlm-cpu-turbomind"  # the service name benchmarks/cpu_matrix.py records under
runner = CliRunner()


@pytest.fixture(scope="module")
def run(jaeger, tmp_path_factory) -> tuple[Path, int]:
    """The scenario recorded in a child process exporting to the session's Jaeger: its packed journal, and
    the number of traces Jaeger holds once it has every span of the journal."""
    out = tmp_path_factory.mktemp("run")
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_http_endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
    }
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "cpu_matrix.py"), "one", "--id", SCENARIO, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / f"{SCENARIO}.result.json").read_text())
    assert (result["requests_done"], result["truncated"]) == (120, False)
    journal = out / "packed" / SCENARIO
    spans = [span for path in sorted(journal.glob("*.jsonl.gz")) for span in journal_spans(path)]
    traces = len({span.context.trace_id for span in spans})
    jaeger.wait_for(
        "/api/v3/traces",
        lambda d: v3_span_count(d) == len(spans),
        {"query.service_name": SERVICE, "query.num_traces": 10 * traces, **ALL_TIME},
    )
    return journal, traces


def _report(tmp_path: Path, *arguments: str) -> tuple[int, str, dict | None]:
    tmp_path.mkdir(exist_ok=True)
    summary = tmp_path / "summary.json"
    result = runner.invoke(app, ["report", *arguments, "-o", str(tmp_path / "report.html"), "--json", str(summary)])
    return (
        result.exit_code,
        " ".join(result.output.split()),
        orjson.loads(summary.read_bytes()) if summary.exists() else None,
    )


def _host(summary: dict) -> dict:
    (host,) = [verdict for verdict in summary["verdicts"] if verdict["component"] == "host"]
    return host


def test_a_run_pulled_with_the_defaults_has_the_journals_class_stage_and_slope(run, jaeger, tmp_path: Path):
    journal, traces = run
    assert traces >= 120  # one trace a pipeline call, one call a request: more than a page of the search
    status, output, pulled = _report(tmp_path / "jaeger", "--jaeger", jaeger.query_url, "--query", SERVICE)
    assert status == 0, output
    _, _, recorded = _report(tmp_path / "journal", str(journal))
    from_jaeger, from_journal = _host(pulled), _host(recorded)
    assert (from_journal["class"], from_journal["stage"]) == ("host_growth", "vision.preprocess")
    assert (from_jaeger["class"], from_jaeger["stage"]) == (from_journal["class"], from_journal["stage"])
    assert from_jaeger["slope_bytes_per_request"] == pytest.approx(from_journal["slope_bytes_per_request"], rel=0.05)
    assert (pulled["spans"], pulled["requests"], pulled["warnings"]) == (recorded["spans"], recorded["requests"], [])
    assert [(item["format"], item["spans"]) for item in pulled["inputs"]] == [("Jaeger API v3", recorded["spans"])]


def test_a_small_limit_reads_the_newest_traces_and_says_it_is_a_sample(run, jaeger, tmp_path: Path):
    _, traces = run
    status, output, summary = _report(tmp_path, "--jaeger", jaeger.query_url, "--query", SERVICE, "--limit", "20")
    assert status == 0, output
    (warning,) = summary["warnings"]
    assert (warning["kind"], warning["traces_read"], warning["bound"]) == ("pull_sample", 20, "limit")
    assert 20 < warning["traces_matched"] <= traces
    assert warning["message"].startswith(
        f"A sample: the newest 20 of at least {warning['traces_matched']} traces of "
        f"service '{SERVICE}' (--limit 20), every trace from "
    )
    assert warning["message"] in output  # printed, and the first sentence of the headline
    assert summary["requests"] == 20
    for verdict in summary["verdicts"]:  # a rate, where one is said, is said to be the sample's
        if verdict["class"] == "host_growth":
            assert "(over the 20 traces read: a sample)" in output


def _whole_search_bytes(jaeger) -> int:
    url = remote.url_of(
        jaeger.query_url, "/api/v3/traces", {"query.service_name": SERVICE, "query.num_traces": 1000, **ALL_TIME}
    )
    with urllib.request.urlopen(url, timeout=30) as response:
        return len(response.read())


def test_a_pull_its_byte_budget_cuts_short_exits_2_with_the_counts(run, jaeger, tmp_path: Path, monkeypatch):
    _, traces = run
    monkeypatch.setattr(remote, "PAGE", 10)  # pages of 10 traces: the budget stops the pull between two of them
    budget_mb = _whole_search_bytes(jaeger) / 2 / 1e6
    status, output, summary = _report(
        tmp_path, "--jaeger", jaeger.query_url, "--query", SERVICE, "--max-mb", f"{budget_mb:.6f}"
    )
    assert status == 2, output
    (warning,) = summary["warnings"]
    read, matched = warning["traces_read"], warning["traces_matched"]
    assert (warning["kind"], warning["bound"]) == ("pull_incomplete", "bytes")
    assert 0 < read < traces and read <= matched <= traces
    assert warning["message"].startswith(
        f"Incomplete pull: {read} of at least {matched} traces of service '{SERVICE}' read, every trace from "
    )
    assert f"stopped: the pull reached its budget of {float(f'{budget_mb:.6f}'):g} MB (--max-mb)" in warning["message"]
    assert warning["message"] in output and "(exit 2; --limit N asks for a sample)" in output
