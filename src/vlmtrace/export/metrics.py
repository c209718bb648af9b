"""OTLP metric export with the traces' settings, for `vlmtrace.configure()` (and what `vlmtrace doctor` shows).

vlmtrace's instruments are created through the API (`metrics.get_meter`): they record into the provider
passed to `instrument()` or the global one, whenever the application installs it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from urllib.parse import urlparse

from opentelemetry.sdk.environment_variables import OTEL_EXPORTER_OTLP_ENDPOINT
from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader

from vlmtrace.config import Options
from vlmtrace.export.journal.redaction import redacted_text
from vlmtrace.export.otlp import explicit_endpoint
from vlmtrace.export.sdk_compat import ParentOnlyMetricReader

_log = logging.getLogger(__name__)

OTEL_METRICS_EXPORTER = "OTEL_METRICS_EXPORTER"
OTEL_EXPORTER_OTLP_METRICS_ENDPOINT = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
OTEL_EXPORTER_OTLP_METRICS_PROTOCOL = "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"
_TRACES_PATH = "/v1/traces"
_METRICS_PATH = "/v1/metrics"


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def otlp_metrics_wanted(options: Options, environ: Mapping[str, str] | None = None) -> bool:
    """On when an endpoint is set as an option, OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_METRICS_ENDPOINT
    is set, or OTEL_METRICS_EXPORTER names otlp; off when it names none. (A traces-only endpoint variable
    is for traces only.)"""
    environ = _environ(environ)
    exporters = {name.strip().lower() for name in environ.get(OTEL_METRICS_EXPORTER, "").split(",") if name.strip()}
    if "none" in exporters:
        return False
    return (
        explicit_endpoint(options, environ) is not None
        or "otlp" in exporters
        or any(
            environ.get(name, "").strip() for name in (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_METRICS_ENDPOINT)
        )
    )


def metrics_protocol(options: Options, environ: Mapping[str, str] | None = None) -> str:
    return _environ(environ).get(OTEL_EXPORTER_OTLP_METRICS_PROTOCOL, "").strip() or options.otlp_protocol


def metrics_endpoint(options: Options, environ: Mapping[str, str] | None = None) -> str | None:
    """The URL for the metric exporter, or None to let it apply the OTEL_EXPORTER_OTLP_* variables or its default.

    An endpoint set as an option is reused, unless OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is set: for HTTP,
    a path ending in `/v1/traces` becomes `/v1/metrics`, and any other path (or none) gets `/v1/metrics`
    appended; gRPC uses it as it is.
    """
    environ = _environ(environ)
    url = explicit_endpoint(options, environ)
    if url is None or environ.get(OTEL_EXPORTER_OTLP_METRICS_ENDPOINT, "").strip():
        return None
    if metrics_protocol(options, environ) == "grpc":
        return url
    path = urlparse(url).path.rstrip("/")
    base = url.rstrip("/")
    if path.endswith(_TRACES_PATH):
        return base[: -len(_TRACES_PATH)] + _METRICS_PATH
    return base + _METRICS_PATH


def _exporter(protocol: str, endpoint: str | None) -> MetricExporter:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter

        return GrpcExporter(endpoint=endpoint)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

    return HttpExporter(endpoint=endpoint)


def otlp_metric_reader(options: Options, environ: Mapping[str, str] | None = None) -> MetricReader | None:
    """A periodic OTLP reader with the traces' settings (see `metrics_endpoint`), or None when its exporter
    cannot start. Its collections run in the process that created it only (a forked child has its own)."""
    environ = _environ(environ)
    protocol = metrics_protocol(options, environ)
    endpoint = metrics_endpoint(options, environ)
    try:
        return ParentOnlyMetricReader(_exporter(protocol, endpoint))
    except Exception as error:  # noqa: BLE001 - a broken exporter disables metrics, never the service
        _log.warning(
            "vlmtrace: OTLP metrics disabled: cannot create the %s exporter for %s (%s)",
            protocol,
            repr(redacted_text(endpoint)) if endpoint else "the default endpoint",
            error,
        )
        return None
