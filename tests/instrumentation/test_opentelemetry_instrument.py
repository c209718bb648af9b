"""Under the real `opentelemetry-instrument` (contrib's loader, the distro's SDK configurator), vlmtrace and
another instrumentation (system metrics) both load whatever value the environment gives the variables
vlmtrace reads: a value of the GenAI utilities' capture modes is understood, a bad one is at most one
warning naming the variable, and vlmtrace never installs a provider of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.distro", reason="opentelemetry-distro provides the SDK configurator")
pytest.importorskip("opentelemetry.instrumentation.system_metrics", reason="the other instrumentation loaded")

REPO = Path(__file__).resolve().parents[2]
PROGRAM = """
from opentelemetry import trace
from opentelemetry.instrumentation.system_metrics import SystemMetricsInstrumentor
from vlmtrace.instrumentation.instrumentor import LMDeployInstrumentor
session = LMDeployInstrumentor.session
print(session is not None, session is not None and session.options.capture_content,
      SystemMetricsInstrumentor().is_instrumented_by_opentelemetry, type(trace.get_tracer_provider()).__module__)
"""


def run_instrumented(tmp_path: Path, **variables: str) -> tuple[list[str], list[str]]:
    """The program under opentelemetry-instrument; its printed line's words and vlmtrace's log lines."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "VLMTRACE_"))}
    env.update(
        PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]),
        VLMTRACE_JOURNAL=str(tmp_path / "j"),
        VLMTRACE_SAMPLE_INTERVAL_MS="0",
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        **variables,
    )
    launcher = Path(sys.executable).parent / "opentelemetry-instrument"
    done = subprocess.run(
        [str(launcher), sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Failed to auto initialize" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.stdout.split(), [line for line in done.stderr.splitlines() if line.startswith("vlmtrace")]


@pytest.mark.lmdeploy
@pytest.mark.parametrize(
    "value, captured",
    [
        ("SPAN_ONLY", "span_only"),
        ("span_and_event", "span_and_event"),
        ("EVENT_ONLY", "event_only"),
        ("NO_CONTENT", "no_content"),
        ("true", "span_only"),
        ("false", "no_content"),
    ],
)
def test_each_genai_capture_value_loads_every_instrumentation_without_a_warning(tmp_path, value, captured):
    printed, warnings = run_instrumented(tmp_path, OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=value)
    assert printed == ["True", captured, "True", "opentelemetry.sdk.trace"]
    assert warnings == []


@pytest.mark.lmdeploy
@pytest.mark.parametrize(
    "variable, value",
    [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "sometimes"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "0"),
        ("VLMTRACE_JOURNAL_MAX_FILES", "many"),
    ],
)
def test_a_value_vlmtrace_cannot_use_is_one_warning_naming_it_and_every_instrumentation_loads(
    tmp_path, variable, value
):
    printed, warnings = run_instrumented(tmp_path, **{variable: value})
    assert printed == ["True", "no_content", "True", "opentelemetry.sdk.trace"]
    assert len(warnings) == 1, warnings
    assert (
        warnings[0].startswith(f"vlmtrace: {variable}=") and value in warnings[0] and "using the default" in warnings[0]
    )
