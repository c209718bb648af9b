"""Options: keyword arguments over VLMTRACE_* over OTEL_*; a bad keyword raises naming it, a bad environment
value is one warning naming the variable, and its default applies."""

from __future__ import annotations

import logging

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


@pytest.mark.parametrize("environ, field, message", [
    ({"VLMTRACE_SAMPLE_INTERVAL_MS": "fast"}, "sample_interval_ms",
     "VLMTRACE_SAMPLE_INTERVAL_MS='fast' is not an integer; using the default, 100"),
    ({"VLMTRACE_JOURNAL_MAX_BYTES": "10"}, "journal_max_bytes", "VLMTRACE_JOURNAL_MAX_BYTES=10 must be >= 4096"),
    ({"VLMTRACE_CAPTURE_CONTENT": "maybe"}, "capture_content",
     "VLMTRACE_CAPTURE_CONTENT='maybe' is not true/false or one of SPAN_ONLY"),
    ({"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "everything"}, "capture_content",
     "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT='everything' is not true/false"),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "otlp_protocol",
     "OTEL_EXPORTER_OTLP_PROTOCOL='http/json' has no Python exporter (vlmtrace exports with grpc, http/protobuf); "
     "using the default, http/protobuf"),
    ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "carrier-pigeon"}, "otlp_protocol",
     "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='carrier-pigeon' is not an OTLP protocol"),
    ({"OTEL_BSP_MAX_QUEUE_SIZE": "0"}, "otlp_max_queue_size", "OTEL_BSP_MAX_QUEUE_SIZE=0 must be >= 1"),
    ({"VLMTRACE_PROBES": "torch,gpu"}, "probes", "VLMTRACE_PROBES='torch,gpu' names unknown probe(s) gpu"),
    ({"VLMTRACE_TRIM_CACHE": "2GB"}, "trim_cache",
     "VLMTRACE_TRIM_CACHE='2GB' is not a size (bytes, or a number with KiB, MiB, GiB or TiB)"),
    ({"VLMTRACE_TRIM_CACHE": "headroom=lots"}, "trim_cache", "VLMTRACE_TRIM_CACHE headroom='lots' is not a size"),
    ({"VLMTRACE_TRIM_CACHE": "0MiB"}, "trim_cache", "VLMTRACE_TRIM_CACHE='0MiB' must be more than 0 bytes (or off)"),
    ({"VLMTRACE_TRIM_CACHE_INTERVAL_MS": "-1"}, "trim_cache_interval_ms",
     "VLMTRACE_TRIM_CACHE_INTERVAL_MS=-1 must be >= 0"),
    ({"VLMTRACE_TRIM_CACHE": "1GiB", "VLMTRACE_SAMPLE_INTERVAL_MS": "0"}, "trim_cache",
     "VLMTRACE_TRIM_CACHE='1GiB' needs the background sampler"),
])
def test_a_bad_environment_value_warns_once_naming_the_variable_and_the_default_applies(environ, field, message,
                                                                                         caplog):
    with caplog.at_level(logging.WARNING, logger="vlmtrace"):
        options = Options.resolve({}, environ=environ)
    assert getattr(options, field) == getattr(Options(), field)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and message in warnings[0], warnings


@pytest.mark.parametrize("value, captured", [
    ("span_only", True), ("SPAN_AND_EVENT", True), ("event_only", False), ("NO_CONTENT", False),
    ("true", True), ("False", False),
])
def test_the_genai_capture_variable_takes_the_genai_modes_and_booleans(value, captured, caplog):
    with caplog.at_level(logging.WARNING, logger="vlmtrace"):
        options = Options.resolve({}, environ={"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": value})
    assert options.capture_content is captured
    assert not caplog.records


@pytest.mark.parametrize("overrides, message", [
    ({"otlp_protocol": "http/json"}, "OTLP protocol 'http/json' is not one of"),
    ({"probes": ("torch", "gpu")}, "unknown probe(s) gpu"),
    ({"trim_cache": -5}, "trim_cache=-5 must be more than 0 bytes"),
    ({"trim_cache": "1GiB", "sample_interval_ms": 0}, "trim_cache needs the background sampler"),
])
def test_a_bad_keyword_argument_raises_naming_it(overrides, message):
    with pytest.raises(ValueError) as error:
        Options.resolve(overrides, environ={})
    assert message in str(error.value)


def test_cache_guard_is_off_by_default_and_takes_a_cached_bound_or_a_headroom():
    from vlmtrace.config import CacheBound

    assert Options.resolve({}, environ={}).trim_cache is None
    assert Options.resolve({}, environ={"VLMTRACE_TRIM_CACHE": "2GiB"}).trim_cache == CacheBound("cached", 2 << 30)
    assert Options.resolve({}, environ={"VLMTRACE_TRIM_CACHE": "1.5 gib"}).trim_cache == CacheBound("cached", 3 << 29)
    headroom = Options.resolve({}, environ={"VLMTRACE_TRIM_CACHE": "headroom=4GiB"})
    assert headroom.trim_cache == CacheBound("headroom", 4 << 30)
    assert headroom.describe()["trim_cache"] == f"headroom={4 << 30}"
    assert Options.resolve({"trim_cache": 512 << 20}, environ={}).trim_cache == CacheBound("cached", 512 << 20)
    keyword = Options.resolve({"trim_cache": "off"}, environ={"VLMTRACE_TRIM_CACHE": "2GiB"})
    assert keyword.trim_cache is None  # the keyword wins, and turns it off
    assert Options.resolve({}, environ={"VLMTRACE_TRIM_CACHE": "0"}).trim_cache is None
    interval = Options.resolve({}, environ={"VLMTRACE_TRIM_CACHE_INTERVAL_MS": "250"})
    assert (interval.trim_cache_interval_ms, Options().trim_cache_interval_ms) == (250, 5000)


def test_a_cache_guard_bound_of_another_type_is_refused():
    with pytest.raises(TypeError, match="trim_cache=1.5 is not a size or headroom=SIZE"):
        Options.resolve({"trim_cache": 1.5}, environ={})


def test_the_options_warnings_are_their_modules_logger_and_can_be_quieted_alone(caplog):
    bad = {"VLMTRACE_SAMPLE_INTERVAL_MS": "fast"}
    with caplog.at_level(logging.WARNING, logger="vlmtrace"):
        Options.resolve({}, environ=bad)
        quieted = logging.getLogger("vlmtrace.config")
        quieted.setLevel(logging.ERROR)
        try:
            Options.resolve({}, environ=bad)
        finally:
            quieted.setLevel(logging.NOTSET)
    assert [r.name for r in caplog.records] == ["vlmtrace.config"]
