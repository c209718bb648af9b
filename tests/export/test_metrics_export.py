"""Where metrics go: the provider given or the global one (also one set after instrument()), and for
vlmtrace.configure() the traces' OTLP settings and the standard OTEL_*METRICS* variables."""

from __future__ import annotations

import pytest
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExporter, MetricExportResult

import vlmtrace
from vlmtrace import semconv as sc
from vlmtrace.config import Options
from vlmtrace.export.metrics import metrics_endpoint, metrics_protocol, otlp_metrics_wanted


@pytest.mark.parametrize(
    ("configured", "environ", "expected"),
    [
        ("http://c:4318", {}, "http://c:4318/v1/metrics"),
        ("c:4318", {}, "http://c:4318/v1/metrics"),
        ("http://c:4318/v1/traces", {}, "http://c:4318/v1/metrics"),
        ("https://gw/otlp/v1/traces", {}, "https://gw/otlp/v1/metrics"),
        ("https://gw/otlp/", {}, "https://gw/otlp/v1/metrics"),
        # the exporter reads the variables itself:
        ("http://c:4318", {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m:9000/ingest"}, None),
        (None, {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "m:9000/x"}, None),
        ("http://c:4318", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, None),
        (None, {}, None),
    ],
)
def test_http_metrics_endpoint(configured, environ, expected):
    assert metrics_endpoint(Options(otlp_endpoint=configured), environ) == expected


def test_grpc_uses_the_endpoint_as_given_and_the_metrics_protocol_wins():
    options = Options(otlp_endpoint="c:4317", otlp_protocol="grpc")
    assert metrics_endpoint(options, {}) == "http://c:4317"
    assert metrics_protocol(options, {"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf"}) == "http/protobuf"
    assert (
        metrics_endpoint(options, {"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf"})
        == "http://c:4317/v1/metrics"
    )


def test_otlp_metrics_follow_the_endpoint_and_the_exporter_variable():
    assert otlp_metrics_wanted(Options(otlp_endpoint="http://c:4318"), {})
    assert not otlp_metrics_wanted(Options(), {})
    assert otlp_metrics_wanted(Options(), {"OTEL_METRICS_EXPORTER": "otlp"})
    assert otlp_metrics_wanted(Options(), {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m:1"})
    assert otlp_metrics_wanted(Options(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:1"})
    traces_only = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1/v1/traces"}
    assert not otlp_metrics_wanted(Options.resolve(environ=traces_only), traces_only)
    assert not otlp_metrics_wanted(Options(otlp_endpoint="http://c:4318"), {"OTEL_METRICS_EXPORTER": "none"})


def finish_one_request(session) -> None:
    session.metrics.finished.append(
        ({sc.GEN_AI_USAGE_INPUT_TOKENS: 12, sc.GEN_AI_USAGE_OUTPUT_TOKENS: 3}, 0, 10, 40, None)
    )


def metric_names(reader) -> set[str]:
    data = reader.get_metrics_data()
    return {m.name for rm in (data.resource_metrics if data else ()) for sm in rm.scope_metrics for m in sm.metrics}


def test_the_instruments_record_into_the_given_provider_and_leave_it_running():
    reader = InMemoryMetricReader()
    given = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    session = vlmtrace.instrument(meter_provider=given, journal=None, sample_interval_ms=0)
    try:
        finish_one_request(session)
        assert vlmtrace.flush()
        assert {sc.METRIC_REQUEST_DURATION, sc.METRIC_TOKENS} <= metric_names(reader)
        scopes = {sm.scope.schema_url for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics}
        assert scopes == {sc.SCHEMA_URL}
    finally:
        vlmtrace.uninstrument()
    assert not given._shutdown


@pytest.mark.usefixtures("fresh_global_meter_provider")
def test_a_global_provider_installed_after_instrument_receives_the_metrics_and_none_is_installed_before():
    session = vlmtrace.instrument(journal=None, sample_interval_ms=0)
    try:
        assert not isinstance(metrics.get_meter_provider(), MeterProvider)
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader], shutdown_on_exit=False))
        finish_one_request(session)
        assert vlmtrace.flush()
        assert sc.METRIC_REQUEST_DURATION in metric_names(reader)
    finally:
        vlmtrace.uninstrument()


class CountingExporter(MetricExporter):
    def __init__(self) -> None:
        super().__init__()
        self.exports = 0

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        self.exports += 1
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        pass


def test_a_forked_child_exports_nothing_of_its_parents():
    import os

    from vlmtrace.export.sdk_compat import ParentOnlyMetricReader
    from vlmtrace.instrumentation.metrics import Metrics

    exporter = CountingExporter()
    reader = ParentOnlyMetricReader(exporter, export_interval_millis=3_600_000)
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    provider.get_meter("t").create_counter("c").add(1)
    recorded = Metrics(MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("vlmtrace"))
    recorded.on_sample(0, {sc.MEM_HOST_RSS: 123})
    recorded.finished.append(({}, 0, None, 1, None))
    pid = os.fork()
    if pid == 0:  # the child: its exit status says what it found
        reader.collect()
        status = (
            0
            if (
                exporter.exports == 0
                and not recorded.finished
                and recorded.observe_memory(sc.MEM_HOST_RSS, False) == []
            )
            else 1
        )
        os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    reader.collect()
    assert exporter.exports == 1  # the parent goes on exporting
    assert recorded.observe_memory(sc.MEM_HOST_RSS, False)[0].value == 123
    provider.shutdown()


def test_doctor_says_where_metrics_go(monkeypatch):
    from vlmtrace.cli.doctor import _metrics_destination

    for name in ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_METRICS_EXPORTER", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"):
        monkeypatch.delenv(name, raising=False)
    assert _metrics_destination(Options(metrics=False)).startswith("off")
    assert (
        _metrics_destination(Options(otlp_endpoint="http://c:4318/v1/traces"))
        == "http/protobuf http://c:4318/v1/metrics"
    )
    assert _metrics_destination(Options()).startswith("none recorded")
