"""Where vlmtrace's added latency goes: the overhead benchmark with one part of vlmtrace taken out per arm.

    python benchmarks/gpu_ablation.py --backend turbomind --rounds 30 --json ablation.json

Same batches, same rotation and the same output as gpu_overhead.py, with these arms besides `plain`
and `vlmtrace` (each patches the live session for its blocks only; nothing here is an option of
vlmtrace):
- `no-journal`: the journal off (an option);
- `unrecorded-vision`: the two vision spans not recorded;
- `unrecorded-stream`: the engine stream span not recorded;
- `no-relay`: the request's outputs not relayed (the request span ends when `generate` starts);
- `unrecorded-all`: no span recorded, no memory read: the wrappers, their attribute extraction and the
  context hand-offs only;
- `sampler-only`: every wrapper taken off again: the background sampler alone;
- `step-spans`: on the PyTorch engine, one span per decode step instead of one per run of them, each
  ending with the newest reading when younger than 20 ms (what the PyTorch engine's spans do);
- `step-spans-every-read`: one span per decode step, each reading torch's counters afresh at its end;
- `unrecorded-steps`: the PyTorch engine's step spans (prefill steps and decode runs) not recorded;
- `no-response-end`: no reading at a request's last output (`request._response_end`: the PyTorch engine's
  requests only, since TurboMind's stream span ends with the request and takes none);
- `host-from-samples`: span boundaries take host memory from the latest sample instead of reading it;
- `python-counters`: torch's counters through its statistics dict (`native_counters=False`) instead of
  the compiled read (probes/native_counters.py; `vlmtrace` blocks are measured once it is ready);
- `null-wrappers`: every target wrapped by a wrapper that only calls through (nothing else of vlmtrace on the
  request path): what wrapping those calls costs before any work of ours;
- `journal-every-1ms`, `journal-every-16ms`: the journal's flushing thread woken every 1 or 16 ms instead
  of every 4 (what its wake-ups cost; 16 ms would break the journal's 10 ms promise);
- `unwrapped-ROLE`, one per wrapper role of targets.py (`unwrapped-request.preprocess`, ...): that role's
  targets unwrapped, and with them what their wrapper starts (without `request.preprocess` no request is
  open, so `generate` relays nothing and the stream span has no parent to open under).
The difference between an arm and `vlmtrace` is what that part costs on the request path.
`--ablation NAME` (repeatable) runs only those arms besides `plain` and `vlmtrace`.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import wrapt
from gpu_overhead import parse_args, run
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.instrumentation.utils import unwrap

from vlmtrace import semconv as sc
from vlmtrace.export.journal import batching
from vlmtrace.instrumentation import instrumentor, pytorch_decode_runs, request, targets
from vlmtrace.instrumentation.runtime import SpanHandle, Telemetry


class _Unrecorded:
    """What an unrecorded span's children and attribute writes see: the would-be parent's context."""

    __slots__ = ("_context", "attributes", "links")

    def __init__(self, context: Any) -> None:
        self._context = context
        self.attributes: dict[str, Any] = {}
        self.links: Any = ()

    def context(self) -> Any:
        return self._context

    @property
    def span_context(self) -> Any:
        return trace.get_current_span(self._context).get_span_context()


class _UnrecordedHandle(SpanHandle):
    def __init__(self, parent: Any) -> None:
        if isinstance(parent, SpanHandle):
            self.span = parent.span
        else:
            self.span = _Unrecorded(parent if parent is not None else otel_context.get_current())

    def end(self, *args: Any, **kwargs: Any) -> None:
        pass


def unrecorded(names: set[str] | None):
    """Spans named in `names` (every span: None) start as handles that record and read nothing."""

    @contextlib.contextmanager
    def patch(session: Any) -> Iterator[None]:
        original = Telemetry.start

        def start(self, name, stage, attributes=None, context=None, *args, **kwargs):
            if names is None or name in names:
                return _UnrecordedHandle(context)
            return original(self, name, stage, attributes, context, *args, **kwargs)

        Telemetry.start = start
        try:
            yield
        finally:
            Telemetry.start = original

    return patch


@contextlib.contextmanager
def no_relay(session: Any) -> Iterator[None]:
    original = request._outputs

    async def closed_at_once(telemetry, state, outputs, on_close):
        on_close(None)
        async for output in outputs:
            yield output

    request._outputs = closed_at_once
    try:
        yield
    finally:
        request._outputs = original


@contextlib.contextmanager
def sampler_only(session: Any) -> Iterator[None]:
    for owner, attribute in session._wrapped:
        unwrap(owner, attribute)
    yield


def step_spans(reuse_recent_reading: bool):
    """Every decode run ends at the end of its first step (a bound of -1): a span per decode step."""

    @contextlib.contextmanager
    def patch(session: Any) -> Iterator[None]:
        runs = session.decode_runs
        original_bound, end_run = pytorch_decode_runs.RUN_BOUND_NS, runs.end
        pytorch_decode_runs.RUN_BOUND_NS = -1
        if reuse_recent_reading:
            runs.end = lambda error=None, reading=None: end_run(error, reading or runs.readings.end("decode"))
        try:
            yield
        finally:
            pytorch_decode_runs.RUN_BOUND_NS = original_bound
            runs.__dict__.pop("end", None)

    return patch


@contextlib.contextmanager
def no_response_end(session: Any) -> Iterator[None]:
    original = request._response_end
    request._response_end = lambda telemetry, state, output: None
    try:
        yield
    finally:
        request._response_end = original


@contextlib.contextmanager
def host_from_samples(session: Any) -> Iterator[None]:
    session.probe.host_at_boundaries = False
    try:
        yield
    finally:
        session.probe.host_at_boundaries = True


@contextlib.contextmanager
def null_wrappers(session: Any) -> Iterator[None]:
    for owner, attribute in session._wrapped:
        instrumentor._unwrap(owner, attribute)
        wrapt.wrap_function_wrapper(owner, attribute, lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs))
    yield


def journal_interval(seconds: float):
    """The journal's flushing thread wakes every `seconds` (it reads the interval at every wake-up)."""

    @contextlib.contextmanager
    def patch(session: Any) -> Iterator[None]:
        default, batching.FLUSH_INTERVAL_S = batching.FLUSH_INTERVAL_S, seconds
        try:
            yield
        finally:
            batching.FLUSH_INTERVAL_S = default

    return patch


def unwrapped(role: str):
    """Every target of `role` unwrapped for the arm's blocks (the arm's uninstrument() finds them so)."""

    @contextlib.contextmanager
    def patch(session: Any) -> Iterator[None]:
        for target in session.family.targets:
            module = sys.modules.get(target.module)
            if target.role == role and module is not None:
                instrumentor._unwrap(*targets.resolve_attribute(module, target.qualname))
        yield

    return patch


UNWRAPPED_ROLES = (
    targets.PIPELINE_INFER,
    targets.PIPELINE_HANDOFF,
    targets.REQUEST_PREPROCESS,
    targets.REQUEST_GENERATE,
    targets.VISION_PREPROCESS,
    targets.VISION_INFER,
    targets.TURBOMIND_STREAM,
    targets.PYTORCH_FORWARD,
)

ABLATIONS = {
    "no-journal": ({"journal": None}, contextlib.nullcontext),
    "unrecorded-vision": ({}, unrecorded({sc.SPAN_VISION_PREPROCESS, sc.SPAN_VISION_INFER})),
    "unrecorded-stream": ({}, unrecorded({sc.SPAN_TURBOMIND_STREAM, sc.SPAN_PYTORCH_STREAM})),
    "no-relay": ({}, no_relay),
    "unrecorded-all": ({}, unrecorded(None)),
    "sampler-only": ({}, sampler_only),
    "step-spans": ({}, step_spans(reuse_recent_reading=True)),
    "step-spans-every-read": ({}, step_spans(reuse_recent_reading=False)),
    "unrecorded-steps": ({}, unrecorded({sc.SPAN_PYTORCH_FORWARD})),
    "no-response-end": ({}, no_response_end),
    "host-from-samples": ({}, host_from_samples),
    "python-counters": ({"native_counters": False}, contextlib.nullcontext),
    "null-wrappers": ({}, null_wrappers),
    "journal-every-1ms": ({}, journal_interval(0.001)),
    "journal-every-16ms": ({}, journal_interval(0.016)),
    **{f"unwrapped-{role}": ({}, unwrapped(role)) for role in UNWRAPPED_ROLES},
}

if __name__ == "__main__":
    arguments = parse_args(
        __doc__.split("\n")[0],
        lambda parser: parser.add_argument(
            "--ablation", action="append", choices=sorted(ABLATIONS), help="only these arms (default: all)"
        ),
    )
    run(arguments, {name: ABLATIONS[name] for name in arguments.ablation or ABLATIONS})
