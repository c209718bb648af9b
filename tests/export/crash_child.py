"""A traced process that dies inside nested spans, the way the seed-2 TurboMind batch step died.

Usage: crash_child.py MODE JOURNAL [OTLP_ENDPOINT]
  abort-in-thread  a worker thread ("turbomind-batch") calls abort while the main thread is inside spans
  abort-main       the main thread calls abort inside the spans
  sigkill          prints "ready" 10 ms after its last record and waits for the parent's SIGKILL
  kill-self        SIGKILLs itself 10 ms after its last record (the journal's time bound, no handler can run)
  rotate-abort     rotates the journal (small max_bytes) many times, then aborts
  exit             leaves the spans and returns normally (atexit writes the end marker)
  native-handler-abort  a "native library" takes SIGABRT over after the journal armed faulthandler
                   (its handler is libc's `_exit`: the process exits with status 6), then aborts
Environment: FLUSHER_OFF=1 stops the journal's flushing thread from writing queued records, so that
only the fatal-signal handler can have written them; APP_FAULTHANDLER=1 enables faulthandler first.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import signal
import sys
import threading
import time

from opentelemetry import context
from opentelemetry.trace import SpanKind

from vlmtrace import semconv
from vlmtrace.config import Options
from vlmtrace.export.configure import configure
from vlmtrace.export.journal import batching
from vlmtrace.export.recorder import SpanRecorder
from vlmtrace.export.tracing import open_tracing

PROMISED_S = 0.010  # docs/journal.md: after a crash, every record older than this is in the journal
MEMORY_AT_DEATH = {
    semconv.MEM_TORCH_ALLOCATED: 7 << 30,
    semconv.MEM_GPU_USED: 80 << 30,
    semconv.MEM_GPU_PROCESS + semconv.PER_DEVICE_SUFFIX: (40 << 30, 40 << 30),
}


def main(mode: str, journal: str, endpoint: str | None) -> None:
    if os.environ.get("APP_FAULTHANDLER") == "1":
        faulthandler.enable(file=sys.stderr, all_threads=True)
    if os.environ.get("FLUSHER_OFF") == "1":
        batching.FLUSH_INTERVAL_S = 3600
    overrides = {"journal": journal, "shutdown_timeout_ms": 500}
    if mode == "rotate-abort":
        overrides.update(journal_max_bytes=4096, journal_max_files=3)
    if endpoint is not None:
        os.environ["VLMTRACE_SHUTDOWN_TIMEOUT_MS"] = "500"
        configure(endpoint, export_metrics=False)
    tracing = open_tracing(Options.resolve(overrides))
    tracer = Spans(SpanRecorder(tracing.journal, tracing.tracer))
    if mode == "rotate-abort":
        for i in range(200):
            with tracer.start_as_current_span("filler", attributes={"i": i}):
                pass
        tracing.journal.flush()  # rotates as the file passes its limit; a fatal signal's flush does not

    with tracer.start_as_current_span(
        semconv.SPAN_PIPELINE_INFER, attributes={semconv.STAGE: semconv.STAGE_PIPELINE, semconv.PIPELINE_PROMPTS: 40}
    ):
        with tracer.start_as_current_span(
            "chat tiny-vl", attributes={semconv.STAGE: semconv.STAGE_REQUEST, semconv.LMDEPLOY_SESSION_ID: 17}
        ):
            with tracer.start_as_current_span(
                semconv.SPAN_VISION_PREPROCESS, attributes={semconv.VISION_IMAGE_WIDTHS: (640, 640)}
            ):
                pass  # finished before the crash: has an end record
            with tracer.start_as_current_span(
                semconv.SPAN_TURBOMIND_STREAM,
                attributes={semconv.STAGE: semconv.STAGE_ENGINE_STREAM, semconv.MEM_TORCH_ALLOCATED: 6 << 30},
            ):
                if mode == "native-handler-abort":
                    take_sigabrt_over_natively()
                if tracing.journal is not None:
                    tracing.journal.write_sample(time.time_ns(), MEMORY_AT_DEATH)
                    tracing.journal.maintain()  # what the sampler's thread does after each sample
                if mode in ("sigkill", "kill-self", "rotate-abort") or os.environ.get("APP_FAULTHANDLER") == "1":
                    # No fatal-signal flush here (SIGKILL; faulthandler is the application's), or one that
                    # is not promised to catch a sample written right after many rotations (with the other
                    # core busy, 8 aborts in 25 lost it): what the journal promises is every record older
                    # than 10 ms.
                    time.sleep(PROMISED_S)
                die(mode)


class Spans:
    """vlmtrace's recorder with the SDK tracer's `start_as_current_span` shape."""

    def __init__(self, recorder: SpanRecorder) -> None:
        self._recorder = recorder

    @contextlib.contextmanager
    def start_as_current_span(self, name: str, attributes: dict | None = None):
        span = self._recorder.start(name, None, SpanKind.INTERNAL, dict(attributes or {}))
        token = context.attach(span.context())
        try:
            yield span
        finally:
            context.detach(token)
            self._recorder.end(span)


def take_sigabrt_over_natively() -> None:
    """What TurboMind does to SIGABRT: a C handler replaces faulthandler's. Ours is `_exit(signum)`."""
    libc = ctypes.CDLL(None)
    libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
    libc.signal(signal.SIGABRT, ctypes.cast(libc._exit, ctypes.c_void_p))


def die(mode: str) -> None:
    if mode in ("abort-in-thread", "rotate-abort", "native-handler-abort"):
        batch = threading.Thread(target=os.abort, name="turbomind-batch")
        batch.start()
        batch.join()
    elif mode == "abort-main":
        os.abort()
    elif mode == "sigkill":
        print("ready", flush=True)
        time.sleep(60)
    elif mode == "kill-self":
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
