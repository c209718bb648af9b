"""OTLP export that can never make the observed service wait: a bounded queue that counts what it drops.

The SDK's BatchSpanProcessor already exports from its own thread; this module adds what the
service needs around it: drops are counted (queue full, failed exports, spans left at
shutdown) and reported, and force_flush/shutdown return within a set time even when the
endpoint is down or hangs (the SDK's own waits are 30 s and its force_flush ignores its timeout).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from urllib.parse import urlparse

from opentelemetry.sdk.environment_variables import (
    OTEL_BSP_MAX_EXPORT_BATCH_SIZE,
    OTEL_EXPORTER_OTLP_ENDPOINT,
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
)
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from vlmtrace.config import Options
from vlmtrace.export.fork import after_fork_in_child

_log = logging.getLogger(__name__)

_DEFAULT_EXPORT_BATCH_SIZE = 512
_HTTP_TRACES_PATH = "/v1/traces"
_ENDPOINT_VARIABLES = (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT)

DroppedCallback = Callable[[int], None]
WarningCallback = Callable[[str, str], None]


def explicit_endpoint(options: Options, environ: Mapping[str, str] | None = None) -> str | None:
    """The endpoint set as an option, as a URL; None where it came from OTEL_EXPORTER_OTLP_*.

    Options.resolve reads those variables so that `vlmtrace doctor` knows an endpoint is configured, but
    the exporters read them again themselves, with the specification's rules (the signal paths appended
    to OTEL_EXPORTER_OTLP_ENDPOINT, TLS by scheme and OTEL_EXPORTER_OTLP_INSECURE), beside the headers, timeouts
    and certificates vlmtrace never passes: one source for each setting.
    An option without a scheme gets `http://` (the gRPC exporter would otherwise pick TLS).
    """
    environ = os.environ if environ is None else environ
    configured = options.otlp_endpoint
    if configured is None or configured in {environ.get(name, "").strip() for name in _ENDPOINT_VARIABLES}:
        return None
    return configured if "://" in configured else f"http://{configured}"


def traces_endpoint(options: Options, environ: Mapping[str, str] | None = None) -> str | None:
    """The URL handed to the exporter, or None to let it apply the OTEL_EXPORTER_OTLP_* variables or its default.

    For HTTP, an endpoint option without a path of its own gets `/v1/traces`.
    """
    url = explicit_endpoint(options, environ)
    if url is None or options.otlp_protocol == "grpc" or urlparse(url).path not in ("", "/"):
        return url
    return url.rstrip("/") + _HTTP_TRACES_PATH


def _exporter(options: Options, endpoint: str | None) -> SpanExporter:
    if options.otlp_protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=endpoint)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter(endpoint=endpoint)


def _export_batch_size(max_queue_size: int) -> int:
    try:
        configured = int(os.environ.get(OTEL_BSP_MAX_EXPORT_BATCH_SIZE, _DEFAULT_EXPORT_BATCH_SIZE))
    except ValueError:
        configured = _DEFAULT_EXPORT_BATCH_SIZE
    return max(1, min(configured, max_queue_size))


def otlp_span_processor(
    options: Options,
    on_dropped: DroppedCallback | None,
    *,
    on_warning: WarningCallback | None = None,
) -> SpanProcessor | None:
    """A BoundedBatchSpanProcessor exporting per `options` (the endpoint, or the exporter's default where none is
    configured), or None when its exporter cannot start."""
    endpoint = traces_endpoint(options)
    try:
        exporter = _exporter(options, endpoint)
        return BoundedBatchSpanProcessor(
            exporter,
            max_queue_size=options.otlp_max_queue_size,
            max_export_batch_size=_export_batch_size(options.otlp_max_queue_size),
            shutdown_timeout_s=options.shutdown_timeout_ms / 1000,
            destination=f"{options.otlp_protocol} {endpoint or options.otlp_endpoint or 'default endpoint'}",
            on_dropped=on_dropped,
            on_warning=on_warning,
        )
    except Exception as error:  # noqa: BLE001 - a broken exporter disables OTLP, never the service
        _log.warning(
            "vlmtrace: OTLP export disabled: cannot create the %s exporter for %s (%s)",
            options.otlp_protocol,
            endpoint or options.otlp_endpoint or "the default endpoint",
            error,
        )
        return None


class _CountingExporter(SpanExporter):
    """Counts what reaches the exporter and what it failed to deliver; once shut down, exports fail at once."""

    def __init__(self, exporter: SpanExporter, on_failure: Callable[[int], None]) -> None:
        self._exporter = exporter
        self._on_failure = on_failure
        self._aborted = False
        self._shut_down = False
        self.handed = 0
        self.succeeded = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        count = len(spans)
        self.handed += count
        result = SpanExportResult.FAILURE
        if not self._aborted:
            try:
                result = self._exporter.export(spans)
            except Exception:  # noqa: BLE001 - an exporter bug is a failed export
                result = SpanExportResult.FAILURE
            finally:
                # A failed export leaves a reference cycle (the exporter's error, its traceback and
                # the stack of frames down to the batch processor's) that only the cyclic GC frees;
                # every frame holds this batch. Emptied here, its spans are freed as we return
                # (the batch processor does not look at a batch after exporting it).
                if isinstance(spans, list):
                    spans.clear()
        if result is SpanExportResult.SUCCESS:
            self.succeeded += count
        else:
            self._on_failure(count)
        return result

    def shutdown(self) -> None:
        """Stop waiting on the endpoint: the exporter's shutdown cuts its retry back-off short, later exports fail."""
        self._aborted = True
        if self._shut_down:
            return
        self._shut_down = True
        try:
            self._exporter.shutdown()
        except Exception:  # noqa: BLE001
            _log.debug("vlmtrace: OTLP exporter shutdown failed", exc_info=True)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._exporter.force_flush(timeout_millis)

    def reset_counts(self) -> None:
        self.handed = 0
        self.succeeded = 0


class BoundedBatchSpanProcessor(BatchSpanProcessor):
    """BatchSpanProcessor whose queue bound is enforced and counted here, with time-bounded flush and shutdown.

    A span is admitted only while fewer than `max_queue_size` spans wait for the exporter, so the
    SDK's deque never overflows silently; each refused span, each span of a failed export and
    each span still queued at shutdown is counted, and the running total goes to `on_dropped`.
    """

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        max_queue_size: int,
        max_export_batch_size: int,
        shutdown_timeout_s: float,
        destination: str,
        on_dropped: DroppedCallback | None = None,
        on_warning: WarningCallback | None = None,
    ) -> None:
        self._counting = _CountingExporter(exporter, self._count_failed_export)
        self._max_queue_size = max_queue_size
        self._shutdown_timeout_s = shutdown_timeout_s
        self._destination = destination
        self._on_dropped = on_dropped
        self._on_warning = on_warning
        self._count_lock = threading.Lock()
        self._admitted = 0
        self._refused = 0
        self._failed = 0
        self._warned: set[str] = set()
        self._closed = False
        self._final_count_taken = False
        self._flusher: threading.Thread | None = None
        super().__init__(self._counting, max_queue_size=max_queue_size, max_export_batch_size=max_export_batch_size)
        after_fork_in_child(self._forget_parent_counts)

    def report_to(self, on_dropped: DroppedCallback | None, on_warning: WarningCallback | None) -> None:
        """Where the running drop count and the warnings go from now on (a journal opened after the processor)."""
        self._on_dropped, self._on_warning = on_dropped, on_warning
        if self.dropped and on_dropped is not None:
            on_dropped(self.dropped)

    @property
    def dropped(self) -> int:
        """Spans that did not reach the endpoint so far: refused by the full queue or in a failed export."""
        return self._refused + self._failed

    @property
    def queued(self) -> int:
        """Spans admitted and not yet handed to the exporter (never more than max_queue_size)."""
        return self._admitted - self._counting.handed

    def on_end(self, span: ReadableSpan) -> None:
        try:
            if self._closed or not span.context.trace_flags.sampled:
                return
            with self._count_lock:
                if self._admitted - self._counting.handed < self._max_queue_size:
                    self._admitted += 1
                    refused = 0
                else:
                    self._refused += 1
                    refused = self._refused
            if not refused:
                super().on_end(span)
                return
            if refused == 1:
                self._warn_once(
                    "queue", f"OTLP queue full ({self._max_queue_size} spans for {self._destination}): dropping spans"
                )
            self._report_dropped()
        except Exception:  # noqa: BLE001 - never let export break the traced call
            _log.debug("vlmtrace: OTLP on_end failed", exc_info=True)

    def force_flush(self, timeout_millis: int | None = 30000) -> bool:
        """Export what is queued, waiting at most `timeout_millis` (None: 30 s, the SDK's default; the SDK's own
        flush ignores its timeout)."""
        if self._closed:
            return False
        flusher = self._flusher
        if flusher is None or not flusher.is_alive():
            flusher = threading.Thread(target=self._flush_batches, name="vlmtrace-otlp-flush", daemon=True)
            try:
                flusher.start()
            except RuntimeError:  # no new threads while the interpreter exits (Python 3.12+)
                return False
            self._flusher = flusher
        flusher.join(max(0, 30000 if timeout_millis is None else timeout_millis) / 1000)
        return not flusher.is_alive()

    def shutdown(self, deadline: float | None = None) -> None:
        """Export what is queued until `deadline` (monotonic; default: the shutdown timeout from now), then
        give up on the endpoint and count the rest.

        The SDK's batch processor waits on its worker for at most the timeout and then shuts the
        exporter down, which here also ends its retry back-off. It runs in the calling thread:
        Python 3.12+ refuses to start threads from the atexit hook this often runs in.
        """
        with self._count_lock:
            if self._closed:
                return
            self._closed = True
        timeout_s = self._shutdown_timeout_s if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            self._batch_processor.shutdown(timeout_millis=int(timeout_s * 1000))
        except Exception:  # noqa: BLE001
            _log.debug("vlmtrace: OTLP shutdown failed", exc_info=True)
        self._counting.shutdown()
        with self._count_lock:
            unsent = self._admitted - self._counting.succeeded - self._failed
            self._final_count_taken = True
            self._failed += max(0, unsent)
        if unsent > 0:
            self._warn_once("shutdown", f"{unsent} spans were still queued for {self._destination} at shutdown")
        if self.dropped:
            self._report_dropped()

    def _flush_batches(self) -> None:
        try:
            BatchSpanProcessor.force_flush(self)
        except Exception:  # noqa: BLE001
            _log.debug("vlmtrace: OTLP flush failed", exc_info=True)

    def _count_failed_export(self, spans: int) -> None:
        with self._count_lock:
            if self._final_count_taken:
                return  # an export that outlived shutdown: its spans were counted as unsent
            self._failed += spans
        self._warn_once("export", f"export to {self._destination} failed; its spans are dropped (the journal has them)")
        self._report_dropped()

    def _report_dropped(self) -> None:
        if self._on_dropped is None:
            return
        try:
            self._on_dropped(self.dropped)
        except Exception:  # noqa: BLE001
            _log.debug("vlmtrace: on_dropped callback failed", exc_info=True)

    def _warn_once(self, key: str, message: str) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        _log.warning("vlmtrace: %s", message)
        if self._on_warning is not None:
            try:
                self._on_warning("otlp", message)
            except Exception:  # noqa: BLE001
                _log.debug("vlmtrace: on_warning callback failed", exc_info=True)

    def _forget_parent_counts(self) -> None:
        """The SDK empties the queue in a forked child; the counts start over with it."""
        self._count_lock = threading.Lock()
        self._admitted = self._refused = self._failed = 0
        self._counting.reset_counts()
