"""Wiring: the tracer vlmtrace's spans go to (through the OpenTelemetry API) and the journal beside it.

vlmtrace is an instrumentation: it never installs a TracerProvider. Its tracer comes from the provider
passed to `instrument()`, or else the global one through the API's proxy, so that a provider the
application sets after `instrument()` receives vlmtrace's spans from then on. Without any SDK the
tracer is the API's no-op one, and vlmtrace records its spans in the journal only.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import platform
import socket
import sys
import threading
import uuid
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from opentelemetry import trace

import vlmtrace
from vlmtrace import semconv
from vlmtrace.config import Options
from vlmtrace.export import process_end
from vlmtrace.export.journal.writer import JournalWriter

_log = logging.getLogger(__name__)

_UNKNOWN_SERVICE = "unknown_service"


@dataclasses.dataclass
class Tracing:
    """The tracer and journal of one `instrument()`, and the one way to close the journal."""

    tracer: trace.Tracer
    journal: JournalWriter | None
    tracer_provider: Any = None  # the one passed to instrument(); None: the global one
    shutdown_timeout_s: float = 2.0
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)
    _done: bool = dataclasses.field(default=False, repr=False)

    def provider(self) -> Any:
        """The provider vlmtrace's spans go to now (the global one may be set after `instrument()`)."""
        return self.tracer_provider if self.tracer_provider is not None else trace.get_tracer_provider()

    def shutdown(self, at_exit: bool = False) -> None:
        """Write the journal's end record and close it. Idempotent. The provider is its owner's to shut down.
        The OTLP processor `vlmtrace.configure()` installed, if any, is flushed first (within the shutdown
        timeout), or where the process is ending (`at_exit`) shut down, within the one shutdown timeout of
        the process's exit hooks: its spans are sent, and its last count of dropped spans is in the journal."""
        with self._lock:
            if self._done:
                return
            self._done = True
        atexit.unregister(self.shutdown)
        configure = sys.modules.get("vlmtrace.export.configure")
        installed = configure.installed() if configure is not None else None
        if configure is not None and installed is not None and installed.processor is not None:
            if at_exit:
                installed.processor.shutdown(configure.exit_deadline(self.shutdown_timeout_s))
            else:
                installed.processor.force_flush(int(self.shutdown_timeout_s * 1000))
        if self.journal is not None:
            self.journal.close()


def open_tracing(
    options: Options,
    tracer_provider: Any = None,
    resource_attributes: Mapping[str, Any] | None = None,
    versions: Mapping[str, str | None] | None = None,
) -> Tracing:
    """vlmtrace's tracer (`get_tracer` with its version and schema URL) and its journal, opened per `options`."""
    tracer = trace.get_tracer(
        semconv.INSTRUMENTATION_SCOPE, vlmtrace.__version__, tracer_provider, schema_url=semconv.SCHEMA_URL
    )
    journal = None
    if options.journal is not None:
        provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        journal = JournalWriter.open(
            options.journal,
            max_bytes=options.journal_max_bytes,
            max_files=options.journal_max_files,
            # the analyzer reads how the journal was recorded from it
            resource={**(resource_attributes or {}), **resource_of(options, provider)},
            versions=_versions(versions),
            sync=options.journal_sync,
        )
        if journal is not None:
            _announce(journal.path, chosen=options.journal != Options.journal)
    if tracer_provider is None:
        _join_configured_export(journal, resource_attributes)
    tracing = Tracing(
        tracer=tracer,
        journal=journal,
        tracer_provider=tracer_provider,
        shutdown_timeout_s=options.shutdown_timeout_ms / 1000,
    )
    atexit.register(tracing.shutdown, at_exit=True)
    process_end.watch(tracing.shutdown, options.shutdown_timeout_ms / 1000)  # a terminating signal skips atexit
    return tracing


def _join_configured_export(journal: JournalWriter | None, resource_attributes: Mapping[str, Any] | None) -> None:
    """Where `vlmtrace.configure()` installed the global provider, it is vlmtrace's to complete: its Resource
    gets what only `instrument()` knows (the LMDeploy version, whether span boundaries read host memory: the
    analyzer of pulled traces reads them there), and the journal records what vlmtrace's own spans do not:
    other instrumentations' spans (FastAPI's SERVER span, the parent of the request spans) through a journal
    span processor, and the OTLP processor's count of dropped spans. An application's provider is left alone."""
    configure = sys.modules.get("vlmtrace.export.configure")
    installed = configure.installed() if configure is not None else None
    if installed is None:
        return
    from vlmtrace.export import sdk_compat
    from vlmtrace.export.journal.processor import JournalSpanProcessor

    if resource_attributes:
        sdk_compat.update_resource(installed.provider, resource_attributes)
    if journal is not None:
        installed.provider.add_span_processor(JournalSpanProcessor(journal))  # inert once the journal is closed
        if installed.processor is not None:
            installed.processor.report_to(journal.note_dropped, journal.warn)


def resource_of(options: Options, provider: Any = None, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The SDK provider's Resource attributes; without one, what an SDK would detect: service.name (the
    option, else OTEL_RESOURCE_ATTRIBUTES', else vlmtrace's default), the instance id, host and pid, under
    OTEL_RESOURCE_ATTRIBUTES."""
    resource = getattr(provider, "resource", None)
    if resource is not None:
        return dict(resource.attributes)
    environ = os.environ if environ is None else environ
    attributes: dict[str, Any] = {
        "service.instance.id": str(uuid.uuid4()),
        "host.name": socket.gethostname(),
        "process.pid": os.getpid(),
        semconv.RESOURCE_VLMTRACE_VERSION: vlmtrace.__version__,
    }
    attributes.update(_environment_resource(environ.get("OTEL_RESOURCE_ATTRIBUTES", "")))
    detected = str(attributes.get("service.name", _UNKNOWN_SERVICE))
    if options.service_name != Options.service_name or detected.startswith(_UNKNOWN_SERVICE):
        attributes["service.name"] = options.service_name
    return attributes


def _environment_resource(text: str) -> dict[str, str]:
    """OTEL_RESOURCE_ATTRIBUTES (`key=value,...`, values percent-encoded); a malformed pair is skipped."""
    pairs = {}
    for item in text.split(","):
        key, equals, value = item.partition("=")
        if equals and key.strip():
            pairs[key.strip()] = unquote(value.strip())
    return pairs


def _versions(given: Mapping[str, str | None] | None) -> dict[str, str]:
    versions = {"vlmtrace": vlmtrace.__version__, "python": platform.python_version()}
    versions.update({k: v for k, v in (given or {}).items() if v is not None})
    return versions


def _announce(path: str, chosen: bool) -> None:
    """Say where the journal goes: a warning where nobody chose the place (a directory appeared in the
    working directory), a log line where it was configured."""
    message = (
        "vlmtrace: journaling every span and memory sample to %r (for `vlmtrace report`; "
        "VLMTRACE_JOURNAL=off turns it off)"
    )
    _log.log(logging.INFO if chosen else logging.WARNING, message, os.path.abspath(path))
