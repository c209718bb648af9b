"""Wiring for metrics: which MeterProvider receives vlmtrace's instruments, and OTLP export with the traces' settings.

| situation | provider used |
| --- | --- |
| `instrument(meter_provider=p)` | `p` |
| an SDK MeterProvider is already global (`opentelemetry-instrument`, the application) | that one |
| neither, and OTLP metrics are configured | a provider of vlmtrace's own (the traces' Resource) with a periodic OTLP reader |
| neither, no OTLP | none: no instrument exists and nothing is recorded |

vlmtrace's own provider is not installed globally: it exists for vlmtrace's instruments, and it is shut
down (within the shutdown timeout) with the session.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

from opentelemetry import metrics
from opentelemetry.sdk.environment_variables import OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SDK_DISABLED
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter
from opentelemetry.sdk.resources import Resource

from vlmtrace.config import Options
from vlmtrace.export.otlp import explicit_endpoint
from vlmtrace.export.sdk_compat import ParentOnlyMetricReader

_log = logging.getLogger("vlmtrace")

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
    return (explicit_endpoint(options, environ) is not None or "otlp" in exporters
            or any(environ.get(name, "").strip() for name in (OTEL_EXPORTER_OTLP_ENDPOINT,
                                                               OTEL_EXPORTER_OTLP_METRICS_ENDPOINT)))


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


@dataclasses.dataclass
class MetricsExport:
    """The provider vlmtrace's instruments live in, and how to let go of it."""

    provider: Any  # an OpenTelemetry MeterProvider
    owned: bool
    timeout_ms: int
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)
    _done: bool = dataclasses.field(default=False, repr=False)

    def force_flush(self, timeout_ms: int = 5000) -> bool:
        flush = getattr(self.provider, "force_flush", None)
        return bool(flush(timeout_millis=timeout_ms)) if flush is not None else True

    def shutdown(self, deadline: float | None = None) -> None:
        """Export a last time and stop, until `deadline` (monotonic; default: the shutdown timeout from now);
        a provider that is not ours is left running."""
        with self._lock:
            if self._done:
                return
            self._done = True
        atexit.unregister(self.shutdown)
        if self.owned:
            timeout_ms = self.timeout_ms if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            try:
                self.provider.shutdown(timeout_millis=timeout_ms)
            except Exception:  # noqa: BLE001 - shutdown also runs at exit: never raise there
                _log.debug("vlmtrace: meter provider shutdown failed", exc_info=True)


def configure_metrics(options: Options, meter_provider: Any = None, resource: Resource | None = None,
                      environ: Mapping[str, str] | None = None) -> MetricsExport | None:
    """The provider for vlmtrace's instruments (see the table above), or None when metrics are off."""
    environ = _environ(environ)
    if not options.metrics or environ.get(OTEL_SDK_DISABLED, "").strip().lower() == "true":
        return None
    if meter_provider is not None:
        return MetricsExport(meter_provider, owned=False, timeout_ms=options.shutdown_timeout_ms)
    installed = metrics.get_meter_provider()
    if isinstance(installed, MeterProvider):
        return MetricsExport(installed, owned=False, timeout_ms=options.shutdown_timeout_ms)
    if not otlp_metrics_wanted(options, environ):
        return None
    protocol = metrics_protocol(options, environ)
    endpoint = metrics_endpoint(options, environ)
    try:
        reader = ParentOnlyMetricReader(_exporter(protocol, endpoint))
    except Exception as error:  # noqa: BLE001 - a broken exporter disables metrics, never the service
        _log.warning("vlmtrace: OTLP metrics disabled: cannot create the %s exporter for %s (%s)",
                     protocol, endpoint or "the default endpoint", error)
        return None
    provider = MeterProvider(metric_readers=[reader], resource=resource or Resource.create(),
                             shutdown_on_exit=False)
    export = MetricsExport(provider, owned=True, timeout_ms=options.shutdown_timeout_ms)
    atexit.register(export.shutdown)
    return export
