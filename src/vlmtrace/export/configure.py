"""`vlmtrace.configure()`: OpenTelemetry export for an application that sets up none itself.

`instrument()` never installs a provider: it records through whatever provider the application (or
`opentelemetry-instrument`) installs. This is the separate, explicit step for those who want vlmtrace
to set one up: an SDK TracerProvider with an OTLP span exporter, and a MeterProvider with an OTLP
metric reader, installed as the global ones. From then on they are the caller's, as if the caller had
built them: every instrumentation's spans and metrics go through them, the SDK shuts them down at exit
(within vlmtrace's shutdown timeout), and nothing else can install a global provider in this process.
It needs the SDK and the OTLP exporters: `pip install 'vlmtrace[otlp]'`.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import time
import uuid
from collections.abc import Mapping
from typing import Any, NamedTuple

from opentelemetry import metrics, trace

import vlmtrace
from vlmtrace import semconv
from vlmtrace.config import Options

_log = logging.getLogger(__name__)

EXTRA = "vlmtrace[otlp]"
_UNKNOWN_SERVICE = "unknown_service"


class Installed(NamedTuple):
    """What configure() installed: the tracer provider and its OTLP span processor (None: no OTLP)."""

    provider: Any
    processor: Any


_installed: list[Installed] = []  # the latest configure() that installed a provider


def installed() -> Installed | None:
    """What configure() installed, while its provider is the global one (a journal opened later records the
    provider's other spans and the OTLP processor's drops); None otherwise."""
    return _installed[-1] if _installed and _installed[-1].provider is trace.get_tracer_provider() else None


_exit_deadline: list[float] = []  # set by the first exit hook that asks: one shutdown timeout for all of them


def exit_deadline(timeout_s: float) -> float:
    """When the process's exports must be done (monotonic): `timeout_s` from the first exit hook that asks."""
    if not _exit_deadline:
        _exit_deadline.append(time.monotonic() + timeout_s)
    return _exit_deadline[0]


def configure(
    otlp_endpoint: str | None = None,
    *,
    protocol: str | None = None,
    service_name: str | None = None,
    resource_attributes: Mapping[str, Any] | None = None,
    export_metrics: bool = True,
    max_queue_size: int | None = None,
) -> Any:
    """Install an SDK TracerProvider (and MeterProvider) exporting OTLP as the global ones; return the
    TracerProvider. `otlp_endpoint`, `protocol`, `service_name`, `max_queue_size`: as the
    OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_PROTOCOL, OTEL_SERVICE_NAME and OTEL_BSP_MAX_QUEUE_SIZE
    variables, which apply where they are not given (the exporter's default endpoint where neither is). Where an
    SDK provider is installed already, it is left as it is and returned, with a warning.

    Raises ImportError naming the `vlmtrace[otlp]` extra where the SDK or the exporters are missing."""
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider

        from vlmtrace.export.metrics import otlp_metric_reader
        from vlmtrace.export.otlp import otlp_span_processor
    except ImportError as error:
        raise ImportError(
            f"vlmtrace.configure() needs the OpenTelemetry SDK and OTLP exporters: pip install '{EXTRA}' ({error})"
        ) from error

    given = {
        "otlp_endpoint": otlp_endpoint,
        "otlp_protocol": protocol,
        "service_name": service_name,
        "otlp_max_queue_size": max_queue_size,
    }
    options = Options.resolve({key: value for key, value in given.items() if value is not None})
    installed = trace.get_tracer_provider()
    if isinstance(installed, TracerProvider):
        _log.warning(
            "vlmtrace.configure(): an OpenTelemetry SDK TracerProvider is installed already; it stays "
            "as it is, and its exporters receive vlmtrace's spans"
        )
        return installed
    resource = _resource(Resource, options, resource_attributes)
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    processor = otlp_span_processor(options, None) if _wanted("OTEL_TRACES_EXPORTER") else None
    if processor is not None:
        provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    _installed.append(Installed(provider, processor))

    meter_provider = None
    if (
        export_metrics
        and _wanted("OTEL_METRICS_EXPORTER")
        and not isinstance(metrics.get_meter_provider(), MeterProvider)
    ):
        reader = otlp_metric_reader(options)
        if reader is not None:
            meter_provider = MeterProvider(metric_readers=[reader], resource=resource, shutdown_on_exit=False)
            metrics.set_meter_provider(meter_provider)
    atexit.register(_shutdown, provider, processor, meter_provider, options.shutdown_timeout_ms / 1000)
    return provider


def _shutdown(provider: Any, processor: Any, meter_provider: Any, timeout_s: float) -> None:
    """At exit: traces, then metrics, within one shutdown timeout (a dead or hung endpoint costs it once);
    the metrics only where the application has not shut their provider down itself."""
    from vlmtrace.export.sdk_compat import meter_provider_shut_down  # loaded already, by export/metrics.py

    deadline = exit_deadline(timeout_s)
    try:
        if processor is not None:
            processor.shutdown(deadline)
        provider.shutdown()
        if meter_provider is not None and not meter_provider_shut_down(meter_provider):
            meter_provider.shutdown(timeout_millis=max(0.0, (deadline - time.monotonic()) * 1000))
    except Exception:  # noqa: BLE001 - shutdown runs at exit: never raise there
        _log.debug("vlmtrace: shutting down the configured providers failed", exc_info=True)


def _wanted(variable: str) -> bool:
    """OTLP unless the variable (OTEL_TRACES_EXPORTER, OTEL_METRICS_EXPORTER) says none."""
    return "none" not in {name.strip().lower() for name in os.environ.get(variable, "").split(",")}


def _resource(resource_class: Any, options: Options, resource_attributes: Mapping[str, Any] | None) -> Any:
    """service.name, instance id, host and pid, under OTEL_RESOURCE_ATTRIBUTES, under the caller's attributes.

    The default service name yields to a service.name given in OTEL_RESOURCE_ATTRIBUTES;
    one set explicitly (argument or OTEL_SERVICE_NAME) does not.
    """
    resource = resource_class.create(
        {
            "service.instance.id": str(uuid.uuid4()),
            "host.name": socket.gethostname(),
            "process.pid": os.getpid(),
            semconv.RESOURCE_VLMTRACE_VERSION: vlmtrace.__version__,
        }
    )
    detected_name = str(resource.attributes.get("service.name", _UNKNOWN_SERVICE))
    if options.service_name != Options.service_name or detected_name.startswith(_UNKNOWN_SERVICE):
        resource = resource.merge(resource_class({"service.name": options.service_name}))
    if resource_attributes:
        resource = resource.merge(resource_class(dict(resource_attributes)))
    return resource
