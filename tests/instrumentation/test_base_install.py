"""A base install (`pip install vlmtrace`) is an instrumentation's: the OpenTelemetry API, its
instrumentation base and semantic conventions, wrapt and orjson. instrument() works with nothing more,
and the command names the extra it lacks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import tomllib

from vlmtrace.__main__ import EXIT_NO_EXTRA

REPO = Path(__file__).resolve().parents[2]
NOT_IN_A_BASE_INSTALL = (
    "opentelemetry.sdk",
    "opentelemetry.exporter",
    "grpc",
    "typer",
    "rich",
    "pydantic",
    "pandas",
    "plotly",
    "numpy",
    "pyarrow",
    "duckdb",
)
WITHOUT_THEM = f"""
import sys
for name in {NOT_IN_A_BASE_INSTALL!r}:
    sys.modules[name] = None  # as if not installed: importing it raises ImportError
"""


def run_python(code: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_THEM + code, *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_the_base_dependencies_are_an_instrumentations_with_bounds_below_the_next_major_release():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = [requirement.split(">")[0].split("<")[0].split("=")[0].strip() for requirement in project["dependencies"]]
    assert names == [
        "opentelemetry-api",
        "opentelemetry-instrumentation",
        "opentelemetry-semantic-conventions",
        "wrapt",
        "orjson",
    ]
    assert "opentelemetry-api>=1.35,<2" in project["dependencies"]
    extras = project["optional-dependencies"]
    assert {"opentelemetry-sdk", "typer", "rich"} <= {r.split(">")[0] for r in extras["otlp"] + extras["report"]}


def test_instrument_journals_with_the_api_alone(tmp_path):
    done = run_python(
        """
import json, sys, pathlib, vlmtrace
from opentelemetry import trace
session = vlmtrace.instrument(journal=sys.argv[1], sample_interval_ms=0, capture_content="span_and_event")
session.telemetry.start("lmdeploy.vision.preprocess", "vision.preprocess").end()
vlmtrace.uninstrument()
print(type(trace.get_tracer_provider()).__name__)
""",
        str(tmp_path / "j"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["ProxyTracerProvider"]
    text = "".join(path.read_text() for path in (tmp_path / "j").glob("*.jsonl"))
    assert '"name":"lmdeploy.vision.preprocess"' in text and '"k":"end_marker"' in text


def test_configure_and_the_report_command_name_the_extra_they_need():
    done = run_python("""
import vlmtrace
try:
    vlmtrace.configure("http://127.0.0.1:9")
except ImportError as error:
    print(error)
""")
    assert "pip install 'vlmtrace[otlp]'" in done.stdout, done.stderr[-3000:]
    done = run_python("import sys; sys.argv = ['vlmtrace', 'report', 'x']; from vlmtrace.__main__ import main; main()")
    assert done.returncode == EXIT_NO_EXTRA
    assert "pip install 'vlmtrace[report]'" in done.stderr
