"""OpenTelemetry metrics from what vlmtrace already measures, recorded off the request path.

On the H200, anything on the request path cost 3-5x its isolated cost (the GIL is contended by the
engine's threads), so a finished request only appends one tuple to `Telemetry.finished`, a bounded
deque. The sampler thread drains it into the histograms and counters at every sample, and so does
every collection, so an export never misses a finished request. Memory instruments are observable:
their callbacks read the sampler's latest full sample, which NVML, torch and the host were read for
anyway.
"""

from __future__ import annotations

import collections
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry import metrics as otel_metrics
from opentelemetry.metrics import CallbackOptions, Observation

from vlmtrace import __version__
from vlmtrace import semconv as sc
from vlmtrace.export.fork import after_fork_in_child

# A finished request: (the request span's final attributes, start, first output, end (monotonic ns),
# the error's type name or None[, the request's span: its measurements are recorded in its context]).
FinishedRequest = tuple[Mapping[str, Any], int, "int | None", int, "str | None", Any]
MAX_FINISHED = 4096  # ~40 000 requests/s between two samples 100 ms apart before any is lost

# Bucket boundaries advised by the GenAI semantic conventions.
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)
TIME_PER_OUTPUT_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
# LMDeploy's finish reasons of a response that did not succeed (it ends such streams without raising).
UNSUCCESSFUL_FINISH_REASONS = ("error", "abort")
# The GenAI conventions' advice for gen_ai.client.token.usage.
TOKEN_USAGE_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
REQUEST_DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)

# Memory instruments: (metric, sample key, per GPU, description). The hw.gpu.* ones also carry the
# GPU's hw.vendor, hw.model, hw.name and hw.driver_version, as the hardware conventions ask.
MEMORY_INSTRUMENTS = (
    (sc.METRIC_GPU_MEMORY_USAGE, sc.MEM_GPU_USED, True, "Device memory in use on the GPU, all processes"),
    (sc.METRIC_GPU_MEMORY_LIMIT, sc.MEM_GPU_TOTAL, True, "Device memory size of the GPU"),
    (sc.METRIC_PROCESS_GPU_MEMORY_USAGE, sc.MEM_GPU_PROCESS, True, "Device memory held by this process (NVML)"),
    (sc.METRIC_TORCH_ALLOCATED, sc.MEM_TORCH_ALLOCATED, True, "Bytes in live torch tensors"),
    (sc.METRIC_TORCH_RESERVED, sc.MEM_TORCH_RESERVED, True, "Bytes torch's caching allocator holds from CUDA"),
    (
        sc.METRIC_TORCH_INACTIVE_SPLIT,
        sc.MEM_TORCH_INACTIVE_SPLIT,
        True,
        "Free bytes inside torch's split blocks (fragmentation)",
    ),
    (
        sc.METRIC_NATIVE,
        sc.MEM_NATIVE,
        True,
        "This process's device memory outside torch: TurboMind's pool, cuBLAS, NCCL, the CUDA context",
    ),
    (sc.METRIC_PROCESS_MEMORY_USAGE, sc.MEM_HOST_RSS, False, "Physical (resident) host memory of this process"),
)


def system_metrics_report(metric: str) -> bool:
    """Whether opentelemetry-instrumentation-system-metrics instruments this process and reports `metric`
    (its process.memory.usage): then vlmtrace leaves that series to it. Read from the instrumentor's one
    instance without constructing it (its constructor would reset the application's configuration)."""
    module = sys.modules.get("opentelemetry.instrumentation.system_metrics")
    instance = getattr(getattr(module, "SystemMetricsInstrumentor", None), "_instance", None)
    return bool(getattr(instance, "is_instrumented_by_opentelemetry", False)) and metric in (
        getattr(instance, "_config", None) or {}
    )


def per_device(sample: Mapping[str, Any], key: str) -> list[tuple[int, Any]]:
    """(NVML index, value) pairs of one reading in a sample (see docs/schema.md for the layout)."""
    devices = sample.get(sc.MEM_DEVICES) or ()
    values = sample.get(key + sc.PER_DEVICE_SUFFIX)
    if values is None:
        value = sample.get(key)
        values = (value,) if value is not None and len(devices) == 1 else ()
    return list(zip(devices, values, strict=True)) if len(values) == len(devices) else []


class _Observers:
    """The live `Metrics` of one meter. The SDK keeps the first callbacks of an observable instrument
    created twice under one name (instrumenting again into the same provider): those callbacks read
    whichever `Metrics` is current here."""

    def __init__(self) -> None:
        self.current: Metrics | None = None

    def memory(
        self, key: str, by_device: bool, first: bool, hardware: bool
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        """`first`: the SDK calls callbacks in registration order; the first one of a collection prepares it.
        `hardware`: a hw.gpu.* instrument (see MEMORY_INSTRUMENTS)."""

        def observe(options: CallbackOptions) -> Iterable[Observation]:
            metrics = self.current
            if metrics is None:
                return ()
            if first:
                metrics.prepare_collection()
            return metrics.observe_memory(key, by_device, hardware)

        return observe

    def self_time(self, options: CallbackOptions) -> Iterable[Observation]:
        metrics = self.current
        return metrics.observe_self_time() if metrics is not None else ()


_observers_by_meter: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_observers_lock = threading.Lock()
_meters: weakref.WeakKeyDictionary = (
    weakref.WeakKeyDictionary()
)  # by provider: the API's proxy makes a new meter a call


def vlmtrace_meter(meter_provider: Any = None) -> Any:
    """vlmtrace's meter, with its version and schema URL: from the provider given, else from the global one
    (through the API's proxy while none is set, so that a provider installed later receives the instruments).
    One meter per provider: an instrument created again by a later instrument() reports through the same
    callbacks (see _Observers)."""
    provider = meter_provider if meter_provider is not None else otel_metrics.get_meter_provider()
    with _observers_lock:
        meter = _meters.get(provider)
        if meter is None:
            meter = _meters[provider] = provider.get_meter(
                sc.INSTRUMENTATION_SCOPE, __version__, schema_url=sc.SCHEMA_URL
            )
    return meter


class Metrics:
    """vlmtrace's instruments in one meter, fed from the sampler and the finished-request deque."""

    def __init__(
        self,
        meter: Any,
        refresh: Callable[[], None] | None = None,
        gpu_hardware: Mapping[int, Mapping[str, str]] | None = None,
    ) -> None:
        """`refresh`: takes a sample now; used at collection when no sampler thread runs. `gpu_hardware`:
        each GPU's hw.* attributes by NVML index (MemoryProbe.gpu_hardware())."""
        self.finished: collections.deque = collections.deque(maxlen=MAX_FINISHED)
        self._refresh = refresh
        self._gpu_hardware = gpu_hardware or {}
        self._latest: Mapping[str, Any] = {}
        after_fork_in_child(self._forget_parent)
        with _observers_lock:
            observers = _observers_by_meter.get(meter)
            if observers is None:
                observers = _observers_by_meter[meter] = _Observers()
            observers.current = self
        self._observers = observers
        self._time_to_first_token = meter.create_histogram(
            sc.METRIC_TIME_TO_FIRST_TOKEN,
            unit="s",
            description="Time from a request's start to its first output",
            explicit_bucket_boundaries_advisory=TIME_TO_FIRST_TOKEN_BUCKETS,
        )
        self._time_per_output_token = meter.create_histogram(
            sc.METRIC_TIME_PER_OUTPUT_TOKEN,
            unit="s",
            description="Time per output token after the first",
            explicit_bucket_boundaries_advisory=TIME_PER_OUTPUT_TOKEN_BUCKETS,
        )
        self._request_duration = meter.create_histogram(
            sc.METRIC_REQUEST_DURATION,
            unit="s",
            description="Time from a request's start to its last output",
            explicit_bucket_boundaries_advisory=REQUEST_DURATION_BUCKETS,
        )
        self._requests = meter.create_counter(sc.METRIC_REQUESTS, unit="{request}", description="Finished requests")
        self._images = meter.create_counter(sc.METRIC_IMAGES, unit="{image}", description="Images in finished requests")
        self._tokens = meter.create_counter(
            sc.METRIC_TOKENS, unit="{token}", description="Tokens of finished requests, by gen_ai.token.type"
        )
        self._token_usage = meter.create_histogram(
            sc.METRIC_TOKEN_USAGE,
            unit="{token}",
            description="Tokens of each request, by gen_ai.token.type",
            explicit_bucket_boundaries_advisory=TOKEN_USAGE_BUCKETS,
        )
        for position, (name, key, by_device, description) in enumerate(MEMORY_INSTRUMENTS):
            hardware = name.startswith("hw.gpu.")
            meter.create_observable_up_down_counter(
                name, [observers.memory(key, by_device, position == 0, hardware)], unit="By", description=description
            )
        meter.create_observable_counter(
            sc.METRIC_SELF_TIME,
            [observers.self_time],
            unit="s",
            description="Time vlmtrace spent starting and ending spans",
        )

    def _forget_parent(self) -> None:
        """A forked child reports no reading of its parent's and no request the parent finished."""
        self._latest = {}
        self.finished.clear()

    # Feeding ---------------------------------------------------------------------------------------

    def on_sample(self, t_ns: int, attributes: Mapping[str, Any]) -> None:
        """Sampler sink: keep the sample for the memory instruments, record the requests finished since."""
        self._latest = attributes
        self.drain()

    def drain(self) -> None:
        """Histogram points one per request; counter increments summed per attribute set first (each
        measurement the SDK takes costs ~5 us of this thread's time, and the engine shares its GIL)."""
        finished = self.finished
        totals: dict[tuple, int] = {}
        while True:
            try:
                request = finished.popleft()
            except IndexError:
                break
            self._record(totals, *request)
        for (counter, attributes), value in totals.items():
            counter.add(value, dict(attributes))

    def _record(
        self,
        totals: dict[tuple, int],
        attributes: Mapping[str, Any],
        start_ns: int,
        first_ns: int | None,
        end_ns: int,
        error_type: str | None,
        span: Any = None,
    ) -> None:
        """The histograms are recorded in the request span's context (an exemplar links a bucket to its trace
        where the span was sampled); the counters are summed over requests first."""
        context = span.context() if span is not None else None
        common: dict[str, Any] = {
            sc.GEN_AI_OPERATION_NAME: attributes.get(sc.GEN_AI_OPERATION_NAME, sc.SPAN_REQUEST_OPERATION),
            sc.GEN_AI_PROVIDER_NAME: sc.GEN_AI_PROVIDER,
        }
        model = attributes.get(sc.GEN_AI_REQUEST_MODEL)
        if model is not None:
            common[sc.GEN_AI_REQUEST_MODEL] = model
        if error_type is not None:
            common[sc.ERROR_TYPE] = error_type
        self._request_duration.record((end_ns - start_ns) / 1e9, common, context=context)
        output_tokens = attributes.get(sc.GEN_AI_USAGE_OUTPUT_TOKENS)
        reasons = attributes.get(sc.GEN_AI_RESPONSE_FINISH_REASONS)
        reason = reasons[0] if reasons else ("error" if error_type is not None else "unknown")
        # The GenAI conventions define both for successful responses only.
        if first_ns is not None and error_type is None and reason not in UNSUCCESSFUL_FINISH_REASONS:
            self._time_to_first_token.record((first_ns - start_ns) / 1e9, common, context=context)
            if output_tokens is not None and output_tokens > 1:
                self._time_per_output_token.record(
                    (end_ns - first_ns) / 1e9 / (output_tokens - 1), common, context=context
                )
        for token_type, tokens in (("input", attributes.get(sc.GEN_AI_USAGE_INPUT_TOKENS)), ("output", output_tokens)):
            if tokens is not None:
                self._token_usage.record(tokens, {**common, sc.GEN_AI_TOKEN_TYPE: token_type}, context=context)
        base = tuple(common.items())
        for counter, extra, value in (
            (self._requests, ((sc.REQUEST_FINISH_REASON, reason),), 1),
            (self._images, (), attributes.get(sc.REQUEST_IMAGES)),
            (self._tokens, ((sc.GEN_AI_TOKEN_TYPE, "input"),), attributes.get(sc.GEN_AI_USAGE_INPUT_TOKENS)),
            (self._tokens, ((sc.GEN_AI_TOKEN_TYPE, "output"),), output_tokens),
        ):
            if value:
                key = (counter, base + extra)
                totals[key] = totals.get(key, 0) + value

    # Observing (called by the SDK at collection) ---------------------------------------------------

    def prepare_collection(self) -> None:
        """A fresh sample when no sampler thread takes them; the requests finished until now, recorded
        here, are part of this very collection."""
        if self._refresh is not None:
            self._refresh()
        self.drain()

    def observe_memory(self, key: str, by_device: bool, hardware: bool = False) -> list[Observation]:
        sample = self._latest
        if key == sc.MEM_HOST_RSS and system_metrics_report(sc.METRIC_PROCESS_MEMORY_USAGE):
            return []
        if not by_device:
            value = sample.get(key)
            return [Observation(value)] if value is not None else []
        gpus = self._gpu_hardware if hardware else {}
        return [
            Observation(value, {sc.HW_ID: f"gpu{index}", **gpus.get(index, {})})
            for index, value in per_device(sample, key)
        ]

    def observe_self_time(self) -> list[Observation]:
        value = self._latest.get(sc.SELF_SECONDS)
        return [Observation(value)] if value is not None else []

    def close(self) -> None:
        """Record what finished last; the instruments stay in the provider but report nothing more."""
        self.drain()
        with _observers_lock:
            if self._observers.current is self:
                self._observers.current = None
