"""Options: keyword arguments over VLMTRACE_* over OTEL_*; bad values named in the error."""

from __future__ import annotations

import pytest

from vlmtrace.config import Options


def test_defaults():
    options = Options.resolve({}, environ={})
    assert options.journal == "vlmtrace-journal"
    assert options.otlp_endpoint is None
    assert options.capture_content is False
    assert options.sample_interval_ms == 100


def test_environment_then_keywords():
    environ = {
        "OTEL_SERVICE_NAME": "vlm-api",
        "VLMTRACE_JOURNAL": "/var/log/vlmtrace",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
        "VLMTRACE_SAMPLE_INTERVAL_MS": "250",
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true",
        "VLMTRACE_DEVICES": "0,2",
        "VLMTRACE_PROBES": "nvml,host",
    }
    options = Options.resolve({"sample_interval_ms": 50}, environ=environ)
    assert options.service_name == "vlm-api"
    assert options.journal == "/var/log/vlmtrace"
    assert options.otlp_endpoint == "http://collector:4318"
    assert options.otlp_protocol == "grpc"
    assert options.sample_interval_ms == 50
    assert options.capture_content is True
    assert options.devices == (0, 2)
    assert options.probes == ("nvml", "host")


def test_journal_off():
    assert Options.resolve({}, environ={"VLMTRACE_JOURNAL": "off"}).journal is None
    assert Options.resolve({"journal": False}, environ={}).journal is None


@pytest.mark.parametrize("environ, message", [
    ({"VLMTRACE_SAMPLE_INTERVAL_MS": "fast"}, "VLMTRACE_SAMPLE_INTERVAL_MS='fast' is not an integer"),
    ({"VLMTRACE_JOURNAL_MAX_BYTES": "10"}, "VLMTRACE_JOURNAL_MAX_BYTES=10 must be >= 4096"),
    ({"VLMTRACE_CAPTURE_CONTENT": "maybe"}, "VLMTRACE_CAPTURE_CONTENT='maybe' is not a boolean"),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTLP protocol 'http/json' is not one of"),
    ({"VLMTRACE_PROBES": "torch,gpu"}, "unknown probe(s) gpu"),
])
def test_bad_values_are_named(environ, message):
    with pytest.raises(ValueError) as error:
        Options.resolve({}, environ=environ)
    assert message in str(error.value)
