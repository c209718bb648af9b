"""A traced process that dies inside nested spans, the way a TurboMind batch step dies on an abort.

Usage: crash_child.py MODE JOURNAL [OTLP_ENDPOINT]
  abort-in-thread  a worker thread ("turbomind-batch") calls abort while the main thread is inside spans
  abort-main       the main thread calls abort inside the spans
  sigkill          prints "ready" 10 ms after its last record and waits for the parent's SIGKILL
  kill-self        SIGKILLs itself 10 ms after its last record (the journal's time bound, no handler can run)
  rotate-abort     rotates the journal (small max_bytes) many times, then aborts
  exit             leaves the spans and returns normally (atexit writes the end marker)
  native-handler-abort  a "native library" takes SIGABRT over after the journal armed faulthandler
                   (its handler is libc's `_exit`: the process exits with status 6), then aborts
  hanging-handler-abort  a "native library" takes SIGABRT over with a handler that never returns
                   (libc's `pause`), then aborts: the fatal-signal guard ends the process
Every mode dies 10 ms after its last record (what the journal promises after a crash is every record
older than that), or once the flushing thread has taken the queue, where a loaded machine kept it off
the CPU for longer. Environment: APP_FAULTHANDLER=1 enables faulthandler first.
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
    overrides = {"journal": journal, "shutdown_timeout_ms": 500}
    if mode == "rotate-abort":
        overrides.update(journal_max_bytes=16384, journal_max_files=3)
    if endpoint is not None:
        os.environ["VLMTRACE_SHUTDOWN_TIMEOUT_MS"] = "500"
        configure(endpoint, export_metrics=False)
    tracing = open_tracing(Options.resolve(overrides))
    tracer = Spans(SpanRecorder(tracing.journal, tracing.tracer))
    if mode == "rotate-abort":
        for i in range(800):
            with tracer.start_as_current_span("filler", attributes={"i": i}):
                pass
        tracing.journal.flush()  # rotates as the file passes its limit

    with (
        tracer.start_as_current_span(
            semconv.SPAN_PIPELINE_INFER,
            attributes={semconv.STAGE: semconv.STAGE_PIPELINE, semconv.PIPELINE_PROMPTS: 40},
        ),
        tracer.start_as_current_span(
            "chat tiny-vl", attributes={semconv.STAGE: semconv.STAGE_REQUEST, semconv.LMDEPLOY_SESSION_ID: 17}
        ),
    ):
        with tracer.start_as_current_span(
            semconv.SPAN_VISION_PREPROCESS, attributes={semconv.VISION_IMAGE_WIDTHS: (640, 640)}
        ):
            pass  # finished before the crash: has an end record
        with tracer.start_as_current_span(
            semconv.SPAN_TURBOMIND_STREAM,
            attributes={semconv.STAGE: semconv.STAGE_ENGINE_STREAM, semconv.MEM_TORCH_ALLOCATED: 6 << 30},
        ):
            if mode in ("native-handler-abort", "hanging-handler-abort"):
                take_sigabrt_over_natively("_exit" if mode == "native-handler-abort" else "pause")
            if tracing.journal is not None:
                tracing.journal.write_sample(time.time_ns(), MEMORY_AT_DEATH)
                tracing.journal.maintain()  # what the sampler's thread does after each sample
            time.sleep(PROMISED_S)
            wait_for_the_flushing_thread(tracing.journal)
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


def wait_for_the_flushing_thread(journal, limit_s: float = 5.0) -> None:
    """The 10 ms hold where the flushing thread gets the CPU; on a machine too loaded for that, until it did."""
    deadline = time.monotonic() + limit_s
    while journal is not None and journal.queued() and time.monotonic() < deadline:
        time.sleep(0.001)


def take_sigabrt_over_natively(function: str) -> None:
    """What TurboMind does to SIGABRT: a C handler replaces faulthandler's; here the C library's `function`,
    called with the signal's number."""
    libc = ctypes.CDLL(None)
    libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
    libc.signal(signal.SIGABRT, ctypes.cast(getattr(libc, function), ctypes.c_void_p))


def die(mode: str) -> None:
    if mode in ("abort-in-thread", "rotate-abort", "native-handler-abort", "hanging-handler-abort"):
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
