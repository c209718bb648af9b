"""Numbers a user types, or leaves in the environment, that no option can take: NaN, infinities, numbers
past any machine integer, superscript and other non-ASCII digits, zero and negatives. Each is refused
with exit 2 and a sentence naming the option or variable and its range, before any input is read; none
is an internal error; escape sequences in a value are shown escaped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.analysis.synthetic import MiB, Scenario, write_journal
from tests.hostile.cli import SOURCE, changed, tree, vlmtrace
from vlmtrace import semconv as sc

HUGE = "9" * 400  # past a float: float() makes it infinite
LONG = "9" * 30  # past a C ssize_t
PULL = ("--tempo", "http://127.0.0.1:9")  # never reached: the values are refused before any request


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    (tmp_path / "journal").mkdir()
    write_journal(
        Scenario(requests=20, rates={"tensor": 4 * MiB}, stages={"tensor": sc.STAGE_ENGINE_STREAM}),
        tmp_path / "journal" / "vlmtrace-h-1-1.jsonl",
    )
    return tmp_path


def _refused(run_dir: Path, arguments: list[str], words: str, env: dict[str, str] | None = None, record=None) -> None:
    before = tree(run_dir)
    run = vlmtrace(*arguments, cwd=run_dir, env=env, record=record)
    assert run.code == 2, run.output
    assert words in run.output, run.output
    assert "\x1b" not in run.stdout + run.stderr and "\u202e" not in run.stdout + run.stderr
    assert changed(before, tree(run_dir)) == set()


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--interval", "nan"),
        ("--interval", "inf"),
        ("--interval", "-inf"),
        ("--interval", "1e400"),
        ("--interval", "1e30"),
        ("--interval", "0"),
        ("--interval", "-1"),
        ("--window", LONG),
        ("--window", "0"),
        ("--window", "100001"),
    ],
)
def test_top_refuses_an_interval_or_window_out_of_range(run_dir: Path, option: str, value: str, record_property):
    _refused(
        run_dir, ["top", "journal", "--once", option, value], f"Invalid value for '{option}'", record=record_property
    )


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--timeout", "nan"),
        ("--timeout", "inf"),
        ("--timeout", "0"),
        ("--timeout", "-5"),
        ("--timeout", "1e300"),
        ("--max-mb", "nan"),
        ("--max-mb", "inf"),
        ("--max-mb", "0"),
        ("--max-mb", "1e300"),
        ("--limit", "0"),
        ("--limit", LONG),
        ("--limit", "-1"),
        ("--lookback", "infd"),
        ("--lookback", "nanh"),
        ("--lookback", "1e400s"),
        ("--lookback", "0s"),
        ("--lookback", "-1h"),
        ("--lookback", "99999999d"),
        ("--lookback", "\x1b[2J\u202e1h"),
    ],
)
def test_pull_options_out_of_range_are_refused(run_dir: Path, option: str, value: str, record_property):
    _refused(
        run_dir,
        ["report", "journal", "-o", "out.html", *PULL, f"{option}={value}"],
        "Invalid value for",
        record=record_property,
    )


@pytest.mark.parametrize(
    "options", [["--timeout", "nan"], ["--max-mb", "inf"], ["--lookback", "infd"], ["--limit", LONG]]
)
def test_diff_refuses_the_same_pull_options(run_dir: Path, options: list[str], record_property):
    _refused(
        run_dir,
        ["diff", "journal", "journal", "-o", "out.html", *PULL, *options],
        "Invalid value for",
        record=record_property,
    )


@pytest.mark.parametrize(
    "value",
    [
        f"records={HUGE}",
        "spans=nan",
        "cpu-seconds=inf",
        "records=1e9",
        "records=²",
        "records=-1",
        "records=0",
        "input-bytes=2048T",
        "records=\u0661\u0662",
        "\x1b]0;x\x07=1",
    ],
)
def test_a_read_bound_no_input_could_use_is_refused(run_dir: Path, value: str, record_property):
    _refused(
        run_dir,
        ["report", "journal", "-o", "out.html", "--max", value],
        "Invalid value for --max",
        record=record_property,
    )


@pytest.mark.parametrize("variable", ["VLMTRACE_REPORT_PROCESSES", "VLMTRACE_REPORT_MAX_EXPANDED_BYTES"])
@pytest.mark.parametrize("value", ["²", "0", "-1", "1e3", LONG, HUGE, "\u0661", "nan", "inf", "\x1b[2J"])
def test_an_analyzer_variable_that_is_not_a_count_is_refused_naming_it(
    run_dir: Path, variable: str, value: str, record_property
):
    _refused(run_dir, ["report", "journal", "-o", "out.html"], variable, env={variable: value}, record=record_property)


@pytest.mark.parametrize("variable", ["VLMTRACE_REPORT_PROCESSES", "VLMTRACE_REPORT_MAX_EXPANDED_BYTES"])
def test_diff_refuses_the_same_variables(run_dir: Path, variable: str, record_property):
    _refused(
        run_dir, ["diff", "journal", "journal", "-o", "out.html"], variable, env={variable: "²"}, record=record_property
    )


BAD_VARIABLES = {
    "VLMTRACE_PROBES": "torch,\x1b]52;c;SGVsbG8=\x07,\u202ehost",
    "VLMTRACE_DEVICES": "0,\x1b[2J",
    "VLMTRACE_SAMPLE_INTERVAL_MS": HUGE,
    "VLMTRACE_JOURNAL_MAX_BYTES": "²",
    "VLMTRACE_JOURNAL_MAX_FILES": LONG,
    "VLMTRACE_SHUTDOWN_TIMEOUT_MS": "nan",
    "VLMTRACE_PROBE_REUSE_US": "-1",
    "VLMTRACE_TRIM_CACHE": HUGE + "GiB",
    "VLMTRACE_TRIM_CACHE_INTERVAL_MS": "\u0661\u0662",
    "OTEL_BSP_MAX_QUEUE_SIZE": "inf",
    "OTEL_EXPORTER_OTLP_ENDPOINT": "http://[::1",
    "OTEL_SERVICE_NAME": "[link=https://x.example]x[/link]\x1b[2J",
}


def test_doctor_warns_of_each_variable_it_cannot_use_and_says_the_endpoint_is_not_a_url(tmp_path: Path):
    """doctor resolves the options as instrument() does: one warning per variable, naming it, its value
    escaped, the default kept. It imports LMDeploy and torch (more than the analysis commands' memory
    bound), so it runs here without that bound."""
    environment = {**os.environ, "PYTHONPATH": SOURCE, "COLUMNS": "200", "TERM": "dumb", **BAD_VARIABLES}
    run = subprocess.run(
        [sys.executable, "-m", "vlmtrace", "doctor"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=600,
        check=False,
    )
    assert run.returncode in (0, 1, 2), run.stdout + run.stderr  # its own codes: ready, a target missing, no LMDeploy
    assert "Traceback" not in run.stdout + run.stderr
    for variable in BAD_VARIABLES.keys() - {"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME"}:
        assert f"vlmtrace: {variable}=" in run.stderr, (variable, run.stderr)
    assert "OTLP: http/protobuf http://[::1: not a URL" in run.stdout, run.stdout
    assert not any(character in run.stdout + run.stderr for character in "\x1b\x07\u202e")
