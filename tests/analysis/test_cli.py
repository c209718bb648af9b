"""`vlmtrace report`: files in, report and summary out, exit codes for CI, no tracebacks on bad input."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from synthetic import MiB, Scenario
from typer.testing import CliRunner

from vlmtrace import __version__
from vlmtrace import semconv as sc
from vlmtrace.cli.main import app

runner = CliRunner()


def _report(tmp_path: Path, *arguments: str):
    return runner.invoke(
        app, ["report", *arguments, "-o", str(tmp_path / "r.html"), "--json", str(tmp_path / "s.json")]
    )


def test_report_writes_html_and_json(tmp_path: Path, journal):
    path, _ = journal(Scenario(requests=60, rates={"native": 8 * MiB}, stages={"native": sc.STAGE_ENGINE_STREAM}))
    result = _report(tmp_path, str(path))
    assert result.exit_code == 0, result.output
    assert "Native memory growth in engine.stream" in result.output
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    assert orjson.loads((tmp_path / "s.json").read_bytes())["leak_found"] is True


def test_fail_on_leak_exits_1_only_when_memory_grows(tmp_path: Path, journal):
    leaking, _ = journal(
        Scenario(requests=60, rates={"tensor": 4 * MiB}, stages={"tensor": sc.STAGE_ENGINE_STREAM}), name="leak.jsonl"
    )
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


COMMANDS = ("report", "diff", "top", "doctor", "run")


def _help(*arguments: str) -> subprocess.CompletedProcess:
    """`python -m vlmtrace ARGS` in a fresh interpreter at 80 columns, as a person runs it (`run` is routed
    by the entry point, not by the app)."""
    return subprocess.run(
        [sys.executable, "-m", "vlmtrace", *arguments],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "80"},
    )


def test_version_is_printed_by_either_flag():
    for flag in ("--version", "-V"):
        result = runner.invoke(app, [flag])
        assert result.exit_code == 0 and result.output == f"vlmtrace {__version__}\n"


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_every_help_is_plain_text_within_80_columns_without_type_names(command):
    arguments = [command] if command else []
    short, long_ = _help(*arguments, "-h"), _help(*arguments, "--help")
    assert short.returncode == 0, short.stderr
    assert short.stdout == long_.stdout
    assert short.stdout.startswith(f"Usage: vlmtrace {command}".rstrip() + " [OPTIONS]")
    assert "-h, --help  " in short.stdout or "-h, --help " in short.stdout
    assert max(len(line) for line in short.stdout.splitlines()) <= 80
    assert not re.search(r"<(list|str|int|float|bool|path)\b|range\]|README", short.stdout), short.stdout
    assert "╭" not in short.stdout  # one style: no boxes for some commands and not others


def test_exit_codes_are_listed_one_per_line():
    text = _help("report", "-h").stdout
    assert re.search(r"^ +4 +the report extra is not installed: pip install 'vlmtrace\[report\]'$", text, re.MULTILINE)


@pytest.mark.parametrize(
    "arguments",
    [
        ["report", "x.jsonl", "--lookback", "6h"],
        ["report", "x.jsonl", "--query", "svc"],
        ["diff", "a", "b", "--limit", "5"],
    ],
)
def test_an_option_that_needs_a_pull_is_refused_without_one(arguments):
    result = runner.invoke(app, arguments)
    assert result.exit_code == 2
    assert "only applies with --tempo or --jaeger" in result.output


def test_a_value_out_of_range_is_refused_in_words(tmp_path: Path):
    result = runner.invoke(app, ["top", str(tmp_path), "--once", "--interval", "0.01"])
    assert result.exit_code == 2 and "0.01 is not between 0.1 and 3600" in result.output


def test_a_missing_report_extra_exits_4_with_the_install_line_as_written(tmp_path: Path, journal, monkeypatch):
    path, _ = journal(Scenario(requests=20))
    monkeypatch.setitem(sys.modules, "vlmtrace.analysis.pipeline", None)  # as where pandas and numpy are not installed
    result = runner.invoke(app, ["report", str(path), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 4
    assert "pip install 'vlmtrace[report]'" in result.output
