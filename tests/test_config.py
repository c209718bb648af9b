"""Options: keyword arguments over VLMTRACE_* over OTEL_*; no value raises: a bad environment value is one
warning naming the variable, and its default applies; a bad or unknown keyword is one warning naming it, and
the option keeps the value it would have had without it."""

from __future__ import annotations

import logging

import pytest

from vlmtrace.config import Options


def test_defaults():
    options = Options.resolve({}, environ={})
    assert options.journal == "vlmtrace-journal"
    assert options.otlp_endpoint is None
    assert options.capture_content == "no_content"
    assert not options.content_on_spans and not options.content_in_events
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
    assert options.capture_content == "span_only"
    assert options.devices == (0, 2)
    assert options.probes == ("nvml", "host")


@pytest.mark.parametrize("spelling", ["off", "OFF", "false", "no", "0"])
def test_journal_off_in_each_spelling_of_the_keyword_and_the_variable(spelling):
    assert Options.resolve({}, environ={"VLMTRACE_JOURNAL": spelling}).journal is None
    assert Options.resolve({"journal": spelling}, environ={}).journal is None
    assert Options.resolve({"journal": spelling}, environ={"VLMTRACE_JOURNAL": "/var/log/j"}).journal is None
    assert Options.resolve({"journal": False}, environ={}).journal is None
    assert Options.resolve({"journal": None}, environ={}).journal is None


@pytest.mark.parametrize(
    "environ, field, message",
    [
        (
            {"VLMTRACE_SAMPLE_INTERVAL_MS": "fast"},
            "sample_interval_ms",
            "VLMTRACE_SAMPLE_INTERVAL_MS='fast' must be an integer from 0 to 3600000; using the default, 100",
        ),
        (
            {"VLMTRACE_JOURNAL_MAX_BYTES": "10"},
            "journal_max_bytes",
            "VLMTRACE_JOURNAL_MAX_BYTES='10' must be an integer from 16384 to 1099511627776",
        ),
        (
            {"VLMTRACE_CAPTURE_CONTENT": "maybe"},
            "capture_content",
            (
                "VLMTRACE_CAPTURE_CONTENT='maybe' is not true/false or one of NO_CONTENT, SPAN_ONLY, EVENT_ONLY, "
                "SPAN_AND_EVENT; using the default, no_content"
            ),
        ),
        (
            {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "everything"},
            "capture_content",
            "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT='everything' is not true/false",
        ),
        (
            {
                "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true",
                "OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental",
            },
            "capture_content",
            (
                "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT='true' is not one of NO_CONTENT, SPAN_ONLY, EVENT_ONLY, "
                "SPAN_AND_EVENT (with OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental"
            ),
        ),
        (
            {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
            "otlp_protocol",
            "OTEL_EXPORTER_OTLP_PROTOCOL='http/json' has no Python exporter (vlmtrace exports with grpc, http/protobuf); "
            "using the default, http/protobuf",
        ),
        (
            {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "carrier-pigeon"},
            "otlp_protocol",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='carrier-pigeon' is not an OTLP protocol",
        ),
        (
            {"OTEL_BSP_MAX_QUEUE_SIZE": "0"},
            "otlp_max_queue_size",
            "OTEL_BSP_MAX_QUEUE_SIZE='0' must be an integer from 1 to",
        ),
        ({"VLMTRACE_PROBES": "torch,gpu"}, "probes", "VLMTRACE_PROBES='torch,gpu' names unknown probe(s) 'gpu'"),
        (
            {"VLMTRACE_TRIM_CACHE": "2GB"},
            "trim_cache",
            "VLMTRACE_TRIM_CACHE='2GB' is not a size (bytes, or a number with KiB, MiB, GiB or TiB)",
        ),
        ({"VLMTRACE_TRIM_CACHE": "headroom=lots"}, "trim_cache", "VLMTRACE_TRIM_CACHE headroom='lots' is not a size"),
        (
            {"VLMTRACE_TRIM_CACHE": "0MiB"},
            "trim_cache",
            "VLMTRACE_TRIM_CACHE='0MiB' must be more than 0 bytes (or off)",
        ),
        (
            {"VLMTRACE_TRIM_CACHE_INTERVAL_MS": "-1"},
            "trim_cache_interval_ms",
            "VLMTRACE_TRIM_CACHE_INTERVAL_MS='-1' must be an integer from 0 to 86400000",
        ),
        (
            {"VLMTRACE_TRIM_CACHE": "1GiB", "VLMTRACE_SAMPLE_INTERVAL_MS": "0"},
            "trim_cache",
            "VLMTRACE_TRIM_CACHE='1GiB' needs the background sampler",
        ),
    ],
)
def test_a_bad_environment_value_warns_once_naming_the_variable_and_the_default_applies(
    environ, field, message, caplog
):
    with caplog.at_level(logging.WARNING, logger="vlmtrace"):
        options = Options.resolve({}, environ=environ)
    assert getattr(options, field) == getattr(Options(), field)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and message in warnings[0], warnings


@pytest.mark.parametrize(
    "variable",
    [
        "VLMTRACE_JOURNAL_MAX_BYTES",
        "VLMTRACE_JOURNAL_MAX_FILES",
        "VLMTRACE_SAMPLE_INTERVAL_MS",
        "OTEL_BSP_MAX_QUEUE_SIZE",
        "VLMTRACE_SHUTDOWN_TIMEOUT_MS",
        "VLMTRACE_PROBE_REUSE_US",
        "VLMTRACE_TRIM_CACHE_INTERVAL_MS",
        "VLMTRACE_DEVICES",
        "VLMTRACE_TRIM_CACHE",
    ],
)
@pytest.mark.parametrize(
    "value",
    [
        "²",
        "\u0661\u0662",
        "9" * 400,
        "9" * 5000,
        "1e30",
        "nan",
        "inf",
        "0x10",
        "1_000",
        "\x1b]52;c;SGVsbG8=\x07",
        "5\u202e",
    ],
)
def test_a_numeric_variable_no_option_can_take_is_one_warning_with_its_value_escaped(variable, value, caplog):
    """Superscript and other non-ASCII digits, numbers past a float or a C integer, NaN, infinities, Python's
    own spellings and escape sequences: none raises in the host, each is one warning, the default kept."""
    with caplog.at_level(logging.WARNING, logger="vlmtrace"):
        options = Options.resolve({}, environ={variable: value})
    assert options == Options()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(f"vlmtrace: {variable}=") and len(warnings[0]) < 300, warnings
    assert not any(character in warnings[0] for character in "\x1b\x07\u202e")


@pytest.mark.parametrize("value", ["torch,\x1b[2J", "\x1b]0;pwned\x07", "host,\u202envml", "x" * 10_000])
def test_an_unknown_probe_is_named_escaped_and_cut(value, caplog):
    with caplog.at_level(logging.WARNING, logger="vlmtrace"):
        assert Options.resolve({}, environ={"VLMTRACE_PROBES": value}).probes == Options().probes
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "names unknown probe(s)" in warning and len(warning) < 400
    assert not any(character in warning for character in "\x1b\x07\u202e")


@pytest.mark.parametrize(
    "value, mode, spans, events",
    [
        ("span_only", "span_only", True, False),
        ("SPAN_AND_EVENT", "span_and_event", True, True),
        ("event_only", "event_only", False, True),
        ("NO_CONTENT", "no_content", False, False),
    ],
)
@pytest.mark.parametrize("opt_in", [None, "gen_ai_latest_experimental", "http, GEN_AI_LATEST_EXPERIMENTAL"])
def test_the_genai_capture_variable_takes_the_genai_modes_with_or_without_the_latest_conventions(
    value, mode, spans, events, opt_in, caplog
):
    environ = {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": value}
    if opt_in is not None:
        environ["OTEL_SEMCONV_STABILITY_OPT_IN"] = opt_in
    with caplog.at_level(logging.WARNING, logger="vlmtrace"):
        options = Options.resolve({}, environ=environ)
    assert (options.capture_content, options.content_on_spans, options.content_in_events) == (mode, spans, events)
    assert not caplog.records


@pytest.mark.parametrize("variable", ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "VLMTRACE_CAPTURE_CONTENT"])
def test_true_puts_content_on_spans_where_the_genai_conventions_read_booleans(variable, caplog):
    with caplog.at_level(logging.WARNING, logger="vlmtrace"):
        assert Options.resolve({}, environ={variable: "true"}).capture_content == "span_only"
        assert Options.resolve({}, environ={variable: "False"}).capture_content == "no_content"
        latest = Options.resolve(
            {}, environ={variable: "true", "OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental"}
        )
    # Under the latest GenAI conventions their variable takes the modes only; vlmtrace's own takes booleans still.
    assert latest.capture_content == ("no_content" if variable.startswith("OTEL_") else "span_only")
    assert len(caplog.records) == (1 if variable.startswith("OTEL_") else 0)


@pytest.mark.parametrize(
    "keyword, mode",
    [
        (True, "span_only"),
        (False, "no_content"),
        ("EVENT_ONLY", "event_only"),
        ("span_and_event", "span_and_event"),
        ("true", "span_only"),
    ],
)
def test_the_capture_keyword_takes_booleans_and_the_modes(keyword, mode):
    environ = {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "span_only"}
    assert Options.resolve({"capture_content": keyword}, environ=environ).capture_content == mode


@pytest.mark.parametrize(
    "overrides, message, field, kept",
    [
        (
            {"otlp_protocol": "http/json"},
            "otlp_protocol='http/json' has no Python exporter",
            "otlp_protocol",
            "http/protobuf",
        ),
        ({"probes": ("torch", "gpu")}, "names unknown probe(s) 'gpu'", "probes", ("torch", "nvml", "host")),
        ({"trim_cache": -5}, "trim_cache=-5 must be more than 0 bytes", "trim_cache", None),
        ({"trim_cache": 1.5}, "trim_cache=1.5 is not a size or headroom=SIZE", "trim_cache", None),
        (
            {"trim_cache": "1GiB", "sample_interval_ms": 0},
            "trim_cache='1GiB' needs the background sampler",
            "trim_cache",
            None,
        ),
        (
            {"sample_interval_ms": "fast"},
            "sample_interval_ms='fast' is not an integer; keeping sample_interval_ms=100",
            "sample_interval_ms",
            100,
        ),
        ({"journal_max_files": 0}, "journal_max_files=0 must be an integer from 1 to 100000", "journal_max_files", 8),
        (
            {"sample_interval_ms": 10**400},
            "sample_interval_ms=a number that large must be an integer from 0 to 3600000",
            "sample_interval_ms",
            100,
        ),
        ({"metrics": "yes please"}, "metrics='yes please' is not a boolean", "metrics", True),
        (
            {"capture_content": "everything"},
            "capture_content='everything' is not true/false",
            "capture_content",
            "no_content",
        ),
        ({"journal": 42}, "journal=42 is not a path (or off)", "journal", "vlmtrace-journal"),
        ({"jornal": "typo"}, "unknown option(s) jornal, ignored", "journal", "vlmtrace-journal"),
    ],
)
def test_a_keyword_that_cannot_be_used_is_one_warning_naming_it_and_the_option_keeps_its_value(
    overrides, message, field, kept, caplog
):
    with caplog.at_level(logging.WARNING, logger="vlmtrace"):
        options = Options.resolve(overrides, environ={})
    assert getattr(options, field) == kept
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and message in warnings[0], warnings


def test_a_keyword_that_cannot_be_used_leaves_the_variables_value():
    options = Options.resolve({"sample_interval_ms": -1}, environ={"VLMTRACE_SAMPLE_INTERVAL_MS": "250"})
    assert options.sample_interval_ms == 250


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


@pytest.mark.parametrize(
    "overrides, error, message",
    [
        ({"jornal": "typo"}, TypeError, "unknown option(s) jornal"),
        ({"trim_cache": "12XB"}, ValueError, "trim_cache='12XB' is not a size"),
        ({"trim_cache": "1GiB", "sample_interval_ms": 0}, ValueError, "trim_cache='1GiB' needs the background sampler"),
    ],
)
def test_strict_resolution_raises_naming_the_keyword_for_a_command_line_that_checks_its_arguments(
    overrides, error, message
):
    with pytest.raises(error) as raised:
        Options.resolve(overrides, environ={}, strict=True)
    assert message in str(raised.value)


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


def test_capture_modes_from_the_environment_and_the_call():
    assert Options.resolve({}, environ={}).capture == "auto"
    assert Options.resolve({}, environ={"VLMTRACE_CAPTURE": "NOW"}).capture == "now"
    assert Options.resolve({}, environ={"VLMTRACE_CAPTURE": "false"}).capture == "off"
    assert Options.resolve({"capture": False}, environ={"VLMTRACE_CAPTURE": "now"}).capture == "off"
    with pytest.raises(ValueError, match="capture='sometimes' is not one of auto, off, now"):
        Options.resolve({"capture": "sometimes"}, environ={}, strict=True)


def test_a_bad_capture_variable_is_a_warning_and_the_default(caplog):
    with caplog.at_level(logging.WARNING, logger="vlmtrace.config"):
        options = Options.resolve({}, environ={"VLMTRACE_CAPTURE": "always", "VLMTRACE_CAPTURE_WINDOW_REQUESTS": "0"})
    assert options.capture == "auto" and options.capture_window_requests == 64
    assert (
        "VLMTRACE_CAPTURE='always'" in caplog.text
        and "VLMTRACE_CAPTURE_WINDOW_REQUESTS='0' must be an integer from 1 to 10000000" in caplog.text
    )
