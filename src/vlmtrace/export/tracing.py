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
from vlmtrace.export.journal import JournalSpanProcessor, JournalWriter
from vlmtrace.export.otlp import otlp_span_processor

_log = logging.getLogger("vlmtrace")

_UNKNOWN_SERVICE = "unknown_service"


@dataclasses.dataclass
class Tracing:
    """What configure_tracing set up, and the one way to take it down again."""

    provider: TracerProvider
    journal: JournalWriter | None
    processors: tuple[SpanProcessor, ...] = ()
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)
    _done: bool = dataclasses.field(default=False, repr=False)

    def shutdown(self) -> None:
        """Flush OTLP within the shutdown timeout, write the journal's end marker, detach our processors. Idempotent."""
        with self._lock:
            if self._done:
                return
            self._done = True
        atexit.unregister(self.shutdown)
        # OTLP first: its final dropped count must reach the journal before the end marker.
        for processor in reversed(self.processors):
            try:
                processor.shutdown()
            except Exception:  # noqa: BLE001 - shutdown runs at exit: never raise there
                _log.debug("vlmtrace: processor shutdown failed", exc_info=True)
        _detach(self.provider, self.processors)
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
    """
    if os.environ.get(OTEL_SDK_DISABLED, "").strip().lower() == "true":
        return Tracing(provider=TracerProvider(shutdown_on_exit=False), journal=None, _done=True)

    provider = tracer_provider if tracer_provider is not None else _installed_sdk_provider()
    owned = provider is None or provider in _OWN_PROVIDERS
    if provider is None:
        provider = TracerProvider(resource=_resource(options, resource_attributes))
        _OWN_PROVIDERS.add(provider)
        trace.set_tracer_provider(provider)

    journal = None
    if options.journal is not None:
        journal = JournalWriter.open(
            options.journal,
            max_bytes=options.journal_max_bytes,
            max_files=options.journal_max_files,
            resource=_resource_attributes(provider),
            versions=_versions(versions),
            sync=options.journal_sync,
        )

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

    tracing = Tracing(provider=provider, journal=journal, processors=tuple(processors))
    atexit.register(tracing.shutdown)
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


def _detach(provider: Any, processors: tuple[SpanProcessor, ...]) -> None:
    """Remove our processors from the provider, which may outlive us (the SDK has no public removal).

    Where the SDK's internals differ, the processors stay attached but inert: both ignore spans
    once shut down.
    """
    multi = getattr(provider, "_active_span_processor", None)
    lock = getattr(multi, "_lock", None)
    if lock is None or not isinstance(getattr(multi, "_span_processors", None), tuple):
        return
    with lock:
        multi._span_processors = tuple(p for p in multi._span_processors if p not in processors)  # noqa: SLF001
