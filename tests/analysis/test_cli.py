"""`vlmtrace report`: files in, report and summary out, exit codes for CI, no tracebacks on bad input."""

from __future__ import annotations

from pathlib import Path

import orjson
from synthetic import MiB, Scenario
from typer.testing import CliRunner

from vlmtrace import semconv as sc
from vlmtrace.cli.main import app

runner = CliRunner()


def _report(tmp_path: Path, *arguments: str):
    return runner.invoke(app, ["report", *arguments, "-o", str(tmp_path / "r.html"), "--json", str(tmp_path / "s.json")])


def test_report_writes_html_and_json(tmp_path: Path, journal):
    path, _ = journal(Scenario(requests=60, rates={"native": 8 * MiB}, stages={"native": sc.STAGE_ENGINE_STREAM}))
    result = _report(tmp_path, str(path))
    assert result.exit_code == 0, result.output
    assert "Native memory growth in engine.stream" in result.output
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    assert orjson.loads((tmp_path / "s.json").read_bytes())["leak_found"] is True


def test_fail_on_leak_exits_1_only_when_memory_grows(tmp_path: Path, journal):
    leaking, _ = journal(Scenario(requests=60, rates={"tensor": 4 * MiB}, stages={"tensor": sc.STAGE_ENGINE_STREAM}), name="leak.jsonl")
    clean, _ = journal(Scenario(requests=60), name="clean.jsonl")
    assert _report(tmp_path, str(leaking), "--fail-on-leak").exit_code == 1
    assert _report(tmp_path, str(clean), "--fail-on-leak").exit_code == 0


def test_bad_input_exits_2_names_file_and_line_and_still_reports(tmp_path: Path, journal):
    good, _ = journal(Scenario(requests=30))
    bad = tmp_path / "bad.json"
    bad.write_text('{"resourceSpans": [\n  {"resource": ')
    result = _report(tmp_path, str(good), str(bad))
    assert result.exit_code == 2
    assert f"{bad}:2" in result.output and "Traceback" not in result.output
    summary = orjson.loads((tmp_path / "s.json").read_bytes())
    assert summary["spans"] > 0
    assert [(p["source"], p["line"]) for p in summary["problems"]] == [(str(bad), 2)]


def test_crash_cut_journal_is_not_bad_input(tmp_path: Path, journal):
    path, _ = journal(Scenario(requests=30, crash_at_request=25))
    result = _report(tmp_path, str(path))
    assert result.exit_code == 0, result.output
    assert "in flight" in result.output


def test_no_input_is_a_usage_error(tmp_path: Path):
    result = runner.invoke(app, ["report", "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 2 and "Traceback" not in result.output


def test_unwritable_output_exits_2_without_traceback(tmp_path: Path, journal):
    path, _ = journal(Scenario(requests=20))
    result = runner.invoke(app, ["report", str(path), "-o", str(tmp_path / "missing" / "r.html")])
    assert result.exit_code == 2 and "cannot write the report" in result.output
