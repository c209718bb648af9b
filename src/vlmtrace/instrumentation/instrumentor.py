"""`LMDeployInstrumentor`: the OpenTelemetry instrumentor (entry point `opentelemetry_instrumentor:
lmdeploy`) behind `vlmtrace.instrument()`.

Targets are wrapped with wrapt when their module is imported (now, if it already is), so
instrumenting never imports an engine the application does not use; `uninstrument()` puts every
original back.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import logging
import threading
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

import wrapt
from opentelemetry import metrics as otel_metrics
from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]  # its bare "type: ignore"
    BaseInstrumentor,  # at the top hides every name of that module from a type checker
)
from opentelemetry.instrumentation.utils import unwrap

from vlmtrace import __version__
from vlmtrace import semconv as sc
from vlmtrace.capture import controller_for
from vlmtrace.capture.controller import AUTO
from vlmtrace.config import Options
from vlmtrace.export.content_events import ContentEvents
from vlmtrace.export.recorder import SpanRecorder
from vlmtrace.instrumentation import (
    detail,
    mp_engine,
    pipeline,
    pytorch_engine,
    request,
    selection,
    server,
    targets,
    turbomind,
    vision,
)
from vlmtrace.instrumentation.cache_guard import CacheGuard
from vlmtrace.instrumentation.metrics import Metrics, vlmtrace_meter
from vlmtrace.instrumentation.pytorch_decode_runs import DecodeRuns
from vlmtrace.instrumentation.pytorch_steps import StepQueues
from vlmtrace.instrumentation.runtime import Telemetry, sync_span, warn_once
from vlmtrace.probes.heap import SURVIVORS_EVERY_S
from vlmtrace.probes.memory import MemoryProbe
from vlmtrace.probes.sampler import Sampler, SampleSink

if TYPE_CHECKING:
    from vlmtrace.export.tracing import Tracing

_log = logging.getLogger(__name__)
_instruments = ("lmdeploy >= 0.4.0",)

WrapperFactory = Callable[["Session"], Any]


def _wrappers() -> dict[str, WrapperFactory]:
    """One wrapper factory per target role (see targets.py)."""
    return {
        targets.PIPELINE_INFER: lambda s: pipeline.pipeline_call(s.telemetry, sc.SPAN_PIPELINE_INFER, "prompts", False),
        targets.PIPELINE_STREAM_INFER: lambda s: pipeline.pipeline_call(
            s.telemetry, sc.SPAN_PIPELINE_STREAM_INFER, "prompts", True
        ),
        targets.PIPELINE_CHAT: lambda s: pipeline.pipeline_call(s.telemetry, sc.SPAN_PIPELINE_CHAT, "prompt", True),
        targets.PIPELINE_HANDOFF: lambda s: pipeline.request_handoff(s.telemetry),
        targets.REQUEST_PREPROCESS: lambda s: request.preprocess(s.telemetry, s.content_events),
        targets.REQUEST_GENERATE: lambda s: request.generate(s.telemetry, s.content_events),
        targets.REQUEST_FROM_MESSAGES: lambda s: request.from_messages(s.telemetry, s.content_events),
        targets.REQUEST_PROMPT_INPUT: lambda s: request.prompt_input(s.telemetry),
        targets.VISION_PREPROCESS: lambda s: vision.encoder_call(
            s.telemetry, s.executors, sc.SPAN_VISION_PREPROCESS, sc.STAGE_VISION_PREPROCESS, True
        ),
        targets.VISION_INFER: lambda s: vision.encoder_call(
            s.telemetry, s.executors, sc.SPAN_VISION_INFER, sc.STAGE_VISION_INFER, False
        ),
        targets.VISION_ENCODE_IMAGES: lambda s: vision.queue_images(s.telemetry, s.queued_images),
        targets.VISION_BATCH: lambda s: vision.encoder_batch(s.telemetry, s.queued_images, s.vit_hooks),
        targets.TURBOMIND_STREAM: lambda s: turbomind.stream(s.telemetry, s.sampler),
        targets.PYTORCH_SCHEDULE: lambda s: pytorch_engine.schedule(s.decode_runs),
        targets.PYTORCH_DISPATCH: lambda s: pytorch_engine.dispatch_to_agent(s.step_queues, s.decode_runs),
        targets.PYTORCH_DRAIN: lambda s: pytorch_engine.forget_dispatched(s.step_queues, s.decode_runs),
        targets.PYTORCH_FORWARD: lambda s: pytorch_engine.forward(
            s.telemetry, s.step_queues, s.vit_hooks, s.decode_runs
        ),
        targets.PYTORCH_MODEL_FORWARD: lambda s: pytorch_engine.engine_model_forward(s.telemetry),
        targets.TORCH_EMPTY_CACHE: lambda s: sync_span(s.telemetry, sc.SPAN_EMPTY_CACHE, sc.STAGE_EMPTY_CACHE),
        targets.PYTORCH_HEAP_TRIM: lambda s: sync_span(s.telemetry, sc.SPAN_HEAP_TRIM, sc.STAGE_HEAP_TRIM, root=True),
        targets.SERVER_APP: lambda s: server.mount(_current_telemetry),
        targets.PYTORCH_MP_SEND: lambda s: mp_engine.send_context(s.telemetry),
        targets.PYTORCH_MP_RECEIVE: lambda s: mp_engine.receive_context(s.telemetry),
    }


def _unwrap(owner: Any, attribute: str) -> None:
    """OpenTelemetry's `unwrap` reads the attribute through its descriptor, which turns a wrapped
    staticmethod (`Engine._try_mem_trim`) back into a plain function that its callers then pass `self`;
    the wrapper stored on a class holds the original as it was defined."""
    stored = vars(owner).get(attribute) if isinstance(owner, type) else None
    if isinstance(stored, wrapt.FunctionWrapper):
        setattr(owner, attribute, stored.__wrapped__)
    else:
        unwrap(owner, attribute)


def _current_telemetry() -> Telemetry | None:
    """The live session's; an app wrapped once keeps asking, across uninstrument and instrument."""
    session = LMDeployInstrumentor.session
    return session.telemetry if session is not None else None


class Session:
    """Everything one `instrument()` set up, and how to take it down again."""

    sampler: Sampler  # made last in __init__; the metrics' refresh reads it later

    def __init__(
        self,
        options: Options,
        tracing: Tracing,
        probe: MemoryProbe,
        choice: selection.Choice,
        lmdeploy_version: str | None,
        meter_provider: Any = None,
        logger_provider: Any = None,
    ) -> None:
        """`meter_provider`, `logger_provider`: those passed to instrument(); None: the global ones (also
        ones set later). The logger is made only where the capture mode asks for content events."""
        self.options = options
        self.tracing = tracing
        self.probe = probe
        self.family = choice.family
        self.family_reason = choice.reason
        self.lmdeploy_version = lmdeploy_version
        sinks: list[SampleSink] = [tracing.journal.write_sample] if tracing.journal is not None else []
        self.meter_provider = meter_provider
        self.metrics: Metrics | None = None
        if options.metrics:
            refresh = None if options.sample_interval_ms > 0 else lambda: self.sampler.sample_once()  # noqa: PLW0108 - the sampler is made below
            self.metrics = Metrics(vlmtrace_meter(meter_provider), refresh, probe.gpu_hardware())
            sinks.append(self.metrics.on_sample)
        upkeep = [tracing.journal.maintain] if tracing.journal is not None else []
        self.telemetry = Telemetry(SpanRecorder(tracing.journal, tracing.tracer), probe, options)
        self.content_events = ContentEvents(logger_provider) if options.content_in_events else None
        self.capture = controller_for(options, tracing.journal, choice.family.targets)
        if self.capture is not None:
            sinks.append(self.capture.on_sample)
        self.cache_guard: CacheGuard | None = None
        if options.trim_cache is not None:  # last: the sample that makes it trim is written first
            self.cache_guard = CacheGuard(self.telemetry, options.trim_cache, options.trim_cache_interval_ms)
            sinks.append(self.cache_guard.on_sample)
        self.sampler = Sampler(probe, options.sample_interval_ms, sinks, upkeep)
        if self.cache_guard is not None:
            self.cache_guard.watch_stage_ends(self.sampler.wake)
        if self.capture is not None:  # counts request ends, then the cache guard's watch
            self.telemetry.span_end_watch = self.capture.watch(self.telemetry.span_end_watch)
        if options.detail_every > 1:
            suspected = self.capture.growth_suspected if self.capture is not None else None
            self.telemetry.detail = detail.DetailSampling(options.detail_every, suspected)
        if self.metrics is not None:
            self.telemetry.finished = self.metrics.finished
        self.sampler.add_source("vlmtrace", lambda: {sc.SELF_SECONDS: self.telemetry.self_ns / 1e9})
        if probe.stage_tags is not None:
            self.sampler.add_source("heap_by_stage", probe.stage_tags.read)
            self.sampler.add_source("heap_survivors", probe.stage_tags.survivors, every_s=SURVIVORS_EVERY_S)
            probe.stage_tags.carry_tasks()
        self.executors = vision.ExecutorPatches(probe.stage_tags)
        self.vit_hooks = vision.VitHooks(self.telemetry)
        self.queued_images = vision.QueuedImages()
        self.step_queues = StepQueues()
        self.decode_runs = DecodeRuns(self.telemetry)
        self.status: dict[str, str] = {}
        self._wrapped: list[tuple[Any, str]] = []
        self._active = True
        self._lock = threading.Lock()

    def hook_all(self) -> None:
        factories = _wrappers()
        by_module: dict[str, list[targets.Target]] = {}
        for target in self.family.targets:
            self.status[target.name] = "waiting for import"
            by_module.setdefault(target.module, []).append(target)
        for module_name, module_targets in by_module.items():
            wrapt.register_post_import_hook(
                functools.partial(self._wrap_module, module_targets=module_targets, factories=factories), module_name
            )
        self.sampler.start()
        atexit.register(self.shutdown_exports, True)  # after the exports' own hooks: runs before them

    def _wrap_module(
        self, module: Any, module_targets: list[targets.Target], factories: dict[str, WrapperFactory]
    ) -> None:
        with self._lock:
            if not self._active:
                return
            for target in module_targets:
                try:
                    owner, attribute = targets.resolve_attribute(module, target.qualname)
                except AttributeError as error:
                    self.status[target.name] = f"missing: {error}"
                    if target.required:
                        warn_once(
                            f"target:{target.name}",
                            "LMDeploy %s has no %s; %s spans are off",
                            self.lmdeploy_version or "(unknown version)",
                            target.name,
                            target.role,
                            logger=_log,
                        )
                    continue
                wrapt.wrap_function_wrapper(owner, attribute, factories[target.role](self))
                self._wrapped.append((owner, attribute))
                self.status[target.name] = "wrapped"

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Flush the tracer provider's processors and the meter provider's readers (where they are SDK ones)."""
        flush_spans = getattr(self.tracing.provider(), "force_flush", None)
        spans = bool(flush_spans(int(timeout_s * 1000))) if flush_spans is not None else True
        if self.metrics is None:
            return spans
        self.metrics.drain()
        provider = self.meter_provider if self.meter_provider is not None else otel_metrics.get_meter_provider()
        flush_metrics = getattr(provider, "force_flush", None)
        return (
            bool(flush_metrics(timeout_millis=int(timeout_s * 1000))) if flush_metrics is not None else True
        ) and spans

    def close(self) -> None:
        with self._lock:
            self._active = False
            for owner, attribute in reversed(self._wrapped):
                _unwrap(owner, attribute)
            self._wrapped.clear()
        self.executors.restore()
        if self.probe.stage_tags is not None:
            self.probe.stage_tags.stop_carrying_tasks()
        self.vit_hooks.remove()
        self.sampler.stop()
        self.decode_runs.end()
        self.telemetry.close_open_requests()
        if self.metrics is not None:
            self.metrics.close()
        atexit.unregister(self.shutdown_exports)
        self.shutdown_exports()
        self.probe.close()

    def shutdown_exports(self, at_exit: bool = False) -> None:
        """The last sample and the journal's end record; the providers are their owners' to shut down.
        Also the exit hook of a session never uninstrumented (`at_exit`: see `Tracing.shutdown`)."""
        if self.capture is not None:  # a window still open is recorded with what it saw
            self.capture.close()
        if self.probe.stage_tags is not None:  # what each stage kept, read to the end of the run
            try:
                self.sampler.sample_once(last=True)
            except Exception:  # noqa: BLE001 - never at the cost of the journal's end below
                _log.exception("vlmtrace: the last memory sample failed")
        self.tracing.shutdown(at_exit=at_exit)


def with_detail_sampling(options: Options, probe: MemoryProbe) -> Options:
    """The options as the session samples requests' stage detail: `detail_every` 1 with the heap counter
    preloaded, which charges each request's allocations to the stage running, and would charge those of a
    request without its stage spans to the request (one warning)."""
    if options.detail_every <= 1 or probe.stage_tags is None:
        return options
    warn_once(
        "detail-heap-counter",
        "detail_every=%d is ignored: the heap counter charges allocations by stage, so every request "
        "records its stage detail",
        options.detail_every,
        logger=_log,
    )
    return dataclasses.replace(options, detail_every=1)


def _configure_export(options: Options) -> None:
    """`instrument(otlp_endpoint=...)`: `vlmtrace.configure()` with the call's endpoint, protocol, service
    name and export queue size (the SDK providers it installs are the application's from then on); a
    warning where it cannot."""
    from vlmtrace.export.configure import configure

    try:
        configure(
            options.otlp_endpoint,
            protocol=options.otlp_protocol,
            service_name=options.service_name,
            export_metrics=options.metrics,
            max_queue_size=options.otlp_max_queue_size,
        )
    except ImportError as error:
        _log.warning("vlmtrace: no OTLP export: %s", error)


class LMDeployInstrumentor(BaseInstrumentor):
    """`LMDeployInstrumentor().instrument(**options)`; options as in `vlmtrace.config.Options`, plus
    `tracer_provider`, `meter_provider` and `logger_provider` (default: the global ones, through the API).
    An `otlp_endpoint` given here also calls `vlmtrace.configure()` first; from the environment alone it
    does not. No option raises: one that cannot be used is a warning (`Options.resolve`)."""

    session: Session | None = None

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> Session:
        from vlmtrace.export.tracing import open_tracing

        tracer_provider = kwargs.pop("tracer_provider", None)
        meter_provider = kwargs.pop("meter_provider", None)
        logger_provider = kwargs.pop("logger_provider", None)
        options = Options.resolve(kwargs)
        if kwargs.get("otlp_endpoint") is not None and options.otlp_endpoint == kwargs["otlp_endpoint"]:
            # an endpoint asked for in the call (one it could use): vlmtrace.configure() first
            _configure_export(options)
        lmdeploy_version = targets.installed_lmdeploy_version()
        choice = selection.choose_family(lmdeploy_version)
        probe = MemoryProbe(
            options.probes, options.devices, options.probe_reuse_us, native_counters=options.native_counters
        )
        options = with_detail_sampling(options, probe)
        resource = {sc.RESOURCE_VLMTRACE_VERSION: __version__, sc.RESOURCE_HOST_AT_BOUNDARIES: probe.host_at_boundaries}
        if lmdeploy_version:
            resource[sc.RESOURCE_LMDEPLOY_VERSION] = lmdeploy_version
        if options.detail_every > 1:
            resource.update(
                detail.declared(options.detail_every, options.capture == AUTO and options.journal is not None)
            )
        versions = {
            "vlmtrace": __version__,
            **({"lmdeploy": lmdeploy_version} if lmdeploy_version else {}),
            **probe.versions(),
        }
        tracing = open_tracing(options, tracer_provider, resource_attributes=resource, versions=versions)
        session = Session(options, tracing, probe, choice, lmdeploy_version, meter_provider, logger_provider)
        session.hook_all()
        LMDeployInstrumentor.session = session
        _log.info(
            "vlmtrace %s: LMDeploy %s, targets of family %s (%s)",
            __version__,
            lmdeploy_version,
            choice.family.name,
            choice.reason,
        )
        return session

    def _uninstrument(self, **kwargs: Any) -> None:
        session, LMDeployInstrumentor.session = LMDeployInstrumentor.session, None
        if session is not None:
            session.close()
