"""Wiring: which TracerProvider gets the journal and OTLP processors, and a shutdown that cannot hang exit."""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import platform
import socket
import threading
import uuid
import weakref
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.environment_variables import OTEL_SDK_DISABLED
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

import vlmtrace
from vlmtrace import semconv
from vlmtrace.config import Options
from vlmtrace.export import process_end, sdk_compat
from vlmtrace.export.journal import JournalSpanProcessor, JournalWriter
from vlmtrace.export.otlp import BoundedBatchSpanProcessor, otlp_span_processor
from vlmtrace.export.recorder import ExportBridge, bridge_for

_log = logging.getLogger("vlmtrace")

_UNKNOWN_SERVICE = "unknown_service"


@dataclasses.dataclass
class Tracing:
    """What configure_tracing set up, and the one way to take it down again."""

    provider: TracerProvider
    journal: JournalWriter | None
    processors: tuple[SpanProcessor, ...] = ()
    bridge: ExportBridge | None = None  # vlmtrace's spans to the provider's processors
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)
    _done: bool = dataclasses.field(default=False, repr=False)

    def shutdown(self, deadline: float | None = None) -> None:
        """Hand our queued spans to the processors, flush OTLP until `deadline` (monotonic; default: the
        shutdown timeout from now), write the journal's end marker, detach our processors. Idempotent."""
        with self._lock:
            if self._done:
                return
            self._done = True
        atexit.unregister(self.shutdown)
        if self.bridge is not None:
            self.bridge.shutdown(deadline)
        # OTLP first: its final dropped count must reach the journal before the end marker.
        for processor in reversed(self.processors):
            try:
                if isinstance(processor, BoundedBatchSpanProcessor):
                    processor.shutdown(deadline)
                else:
                    processor.shutdown()
            except Exception:  # noqa: BLE001 - shutdown runs at exit: never raise there
                _log.debug("vlmtrace: processor shutdown failed", exc_info=True)
        sdk_compat.remove_span_processors(self.provider, self.processors)
        if self.journal is not None:
            self.journal.close()


# Providers configure_tracing created: a later call may add OTLP to them again (re-instrumenting).
_OWN_PROVIDERS: weakref.WeakSet[TracerProvider] = weakref.WeakSet()


def configure_tracing(
    options: Options,
    tracer_provider: TracerProvider | None = None,
    resource_attributes: Mapping[str, Any] | None = None,
    versions: Mapping[str, str | None] | None = None,
) -> Tracing:
    """Attach the journal (and OTLP, on a provider we create) and return the handle that shuts them down.

    A provider that is passed in or already installed globally (opentelemetry-instrument, the
    application) belongs to its owner, who exports from it: only the journal is added. Otherwise a
    new SDK provider with our Resource gets the journal and OTLP processors and becomes the global one.
    Where any processor but the journal's would receive spans, vlmtrace's export bridge (recorder.py)
    is registered on the provider too, first.
    """
    if os.environ.get(OTEL_SDK_DISABLED, "").strip().lower() == "true":
        return Tracing(provider=TracerProvider(shutdown_on_exit=False), journal=None, _done=True)

    provider = tracer_provider if tracer_provider is not None else _installed_sdk_provider()
    owned = provider is None or provider in _OWN_PROVIDERS
    if provider is None:
        provider = TracerProvider(resource=_resource(options, resource_attributes))
        _OWN_PROVIDERS.add(provider)
        trace.set_tracer_provider(provider)
    elif owned and not sdk_compat.update_resource(provider, _resource(options, resource_attributes)):
        # The global provider can be set only once per process: ours from an earlier instrument() stays.
        _log.warning("vlmtrace: this OpenTelemetry SDK cannot change a provider's Resource; "
                     "service.name stays %s", provider.resource.attributes.get("service.name"))

    journal = None
    if options.journal is not None:
        journal = JournalWriter.open(
            options.journal,
            max_bytes=options.journal_max_bytes,
            max_files=options.journal_max_files,
            # the provider's, and ours where the provider is the application's: the analyzer reads how
            # the journal was recorded from it
            resource={**(resource_attributes or {}), **_resource_attributes(provider)},
            versions=_versions(versions),
            sync=options.journal_sync,
        )
        if journal is not None:
            _announce(journal.path, chosen=options.journal != Options.journal)

    processors: list[SpanProcessor] = []
    if journal is not None:
        processors.append(JournalSpanProcessor(journal))
    if owned:
        otlp = otlp_span_processor(
            options,
            journal.note_dropped if journal is not None else None,
            on_warning=journal.warn if journal is not None else None,
        )
        if otlp is not None:
            processors.append(otlp)

    add = getattr(provider, "add_span_processor", None)
    if add is None:
        if processors:
            _log.warning(
                "vlmtrace: the tracer provider %s is not an OpenTelemetry SDK provider; spans are not journaled",
                type(provider).__name__,
            )
        processors = []
    for processor in processors:
        add(processor)

    bridge = None
    if add is not None:
        bridge = bridge_for(provider, vlmtrace.__version__, options.otlp_max_queue_size,
                            options.shutdown_timeout_ms / 1000, journal.note_dropped if journal is not None else None)
    tracing = Tracing(provider=provider, journal=journal, processors=tuple(processors), bridge=bridge)
    atexit.register(tracing.shutdown)
    process_end.watch(tracing.shutdown, options.shutdown_timeout_ms / 1000)  # a terminating signal skips atexit
    return tracing


def _installed_sdk_provider() -> TracerProvider | None:
    installed = trace.get_tracer_provider()
    return installed if isinstance(installed, TracerProvider) else None


def _resource(options: Options, resource_attributes: Mapping[str, Any] | None) -> Resource:
    """service.name, instance id, host and pid, under OTEL_RESOURCE_ATTRIBUTES, under the caller's attributes.

    The default service name yields to a service.name given in OTEL_RESOURCE_ATTRIBUTES;
    one set explicitly (option or OTEL_SERVICE_NAME) does not.
    """
    ours = {
        "service.instance.id": str(uuid.uuid4()),
        "host.name": socket.gethostname(),
        "process.pid": os.getpid(),
        semconv.RESOURCE_VLMTRACE_VERSION: vlmtrace.__version__,
    }
    resource = Resource.create(ours)
    detected_name = str(resource.attributes.get("service.name", _UNKNOWN_SERVICE))
    if options.service_name != Options.service_name or detected_name.startswith(_UNKNOWN_SERVICE):
        resource = resource.merge(Resource({"service.name": options.service_name}))
    if resource_attributes:
        resource = resource.merge(Resource(dict(resource_attributes)))
    return resource


def _resource_attributes(provider: Any) -> dict[str, Any]:
    resource = getattr(provider, "resource", None)
    return dict(resource.attributes) if resource is not None else {}


def _versions(given: Mapping[str, str | None] | None) -> dict[str, str]:
    versions = {"vlmtrace": vlmtrace.__version__, "python": platform.python_version()}
    versions.update({k: v for k, v in (given or {}).items() if v is not None})
    return versions


def _announce(path: str, chosen: bool) -> None:
    """Say where the journal goes: a warning where nobody chose the place (a directory appeared in the
    working directory), a log line where it was configured."""
    message = "vlmtrace: journaling every span and memory sample to %s (for `vlmtrace report`; " \
              "VLMTRACE_JOURNAL=off turns it off)"
    _log.log(logging.INFO if chosen else logging.WARNING, message, os.path.abspath(path))
