"""A run of LMDeploy's real pipeline on the stand-in TurboMind, instrumented with a capture mode, with a host
leak kept by the vision encoder's preprocessing at a line the tests know (LEAK_LINE)."""

from __future__ import annotations

import inspect
import tracemalloc
from collections.abc import Callable
from pathlib import Path

MiB = 1 << 20
LEAK_FILE = str(Path(__file__).resolve())


def keep_host_memory_in_vision_preprocess(monkeypatch, kept: list, size: int) -> None:
    """Installed before instrument(): vlmtrace's wrapper calls it, so the leak runs inside the
    lmdeploy.vision.preprocess span, on the event loop's thread."""
    from lmdeploy.vl.engine import ImageEncoder

    original = ImageEncoder.preprocess

    async def preprocess(encoder, *args, **kwargs):
        kept.append(bytearray(size))  # the leak's line
        return await original(encoder, *args, **kwargs)

    monkeypatch.setattr(ImageEncoder, "preprocess", preprocess)


LEAK_LINE = next(
    number
    for number, text in enumerate(
        inspect.getsource(inspect.getmodule(keep_host_memory_in_vision_preprocess)).splitlines(), 1
    )
    if text.strip().endswith("# the leak's line")
)


def run_pipeline(
    journal: Path,
    requests: int,
    in_flight: int = 4,
    sample_interval_ms: int = 20,
    until: Callable[[], bool] | None = None,
    **options,
) -> None:
    """At most `requests` requests, `in_flight` at a time, ended early once `until()` holds.

    `sample_interval_ms`: the stand-in ends a request every few milliseconds, and the live rule reads a
    settled level per sample: 20 ms gives it a level every few requests (fewer on a loaded machine, where the
    sampler's thread waits for the CPU: a test that needs a window to open and close runs `until` it has)."""
    from lmdeploy import GenerationConfig
    from opentelemetry.sdk.trace import TracerProvider

    import vlmtrace
    from tests.support.cpu_lmdeploy import standin_pipeline
    from tests.support.spans import image

    vlmtrace.instrument(
        tracer_provider=TracerProvider(), journal=str(journal), sample_interval_ms=sample_interval_ms, **options
    )
    try:
        pipe = standin_pipeline()
        gen = GenerationConfig(max_new_tokens=4, top_k=1)
        for _call in range(requests // in_flight):
            pipe([("describe this image", image(64 + 8 * (i % 5), 48, i)) for i in range(in_flight)], gen_config=gen)
            if until is not None and until():
                break
        pipe.close()
    finally:
        vlmtrace.uninstrument()


class HeapWindowClosed:
    """`until` for run_pipeline: true once tracemalloc has been seen tracing and is no longer (a host window
    opened and closed; it counts tens of requests, so a pipeline call of a few never hides one)."""

    def __init__(self) -> None:
        self.opened = False

    def __call__(self) -> bool:
        tracing = tracemalloc.is_tracing()
        self.opened = self.opened or tracing
        return self.opened and not tracing
