"""What every wrapper shares: the tracer, the memory probe, and the bounded maps that carry a
request's span across LMDeploy's threads and tasks.

The wrappers run inside the observed service, so everything here is written to fail closed: an
error of ours is logged once and the wrapped call proceeds as if vlmtrace were not there.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode

from vlmtrace import semconv as sc
from vlmtrace.config import Options
from vlmtrace.export.recorded_span import RecordedSpan
from vlmtrace.export.recorder import SpanRecorder, exception_event
from vlmtrace.instrumentation.detail import DetailSampling
from vlmtrace.probes.memory import MemoryProbe, Reading

# What wrapt calls in place of a wrapped function or method: wrapper(wrapped, instance, args, kwargs).
Wrapper = Callable[[Callable[..., Any], Any, tuple, dict], Any]

_log = logging.getLogger(__name__)
_warned: set[str] = set()
_warned_lock = threading.Lock()

# The session id of the whole-request `generate` (before 0.16) whose code is running, in its context.
SESSION_KEY = otel_context.create_key("vlmtrace.session_id")
# True in the context of a request that records no stage detail (detail.py): the vision spans under it are skipped.
NO_DETAIL_KEY = otel_context.create_key("vlmtrace.no_detail")


def warn_once(key: str, message: str, *args: Any, logger: logging.Logger = _log) -> None:
    """One warning per `key` in the process, on `logger` (the warning module's own)."""
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    logger.warning("vlmtrace: " + message, *args)


def safe(extract: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """Attribute extraction reads LMDeploy internals that move between releases: never let it raise."""
    try:
        return extract(*args)
    except Exception as error:  # noqa: BLE001 - a span without some attributes, never a failed call
        warn_once(
            f"extract:{extract.__qualname__}",
            "could not read attributes in %s (%s: %s); spans lack them",
            extract.__qualname__,
            type(error).__name__,
            error,
            logger=logging.getLogger(extract.__module__),
        )
        return {}


class SpanHandle:
    """A started span (its start reading travels on the span itself) and the session that ends it."""

    __slots__ = ("_outer_heap_stage", "_telemetry", "span")

    def __init__(self, span: RecordedSpan, telemetry: Telemetry, outer_heap_stage: int | None = None) -> None:
        """`outer_heap_stage`: what the starting context's allocations were charged to before the span
        (heap counter only; None without it), charged to again when the span ends."""
        self.span = span
        self._telemetry = telemetry
        self._outer_heap_stage = outer_heap_stage

    def context(self) -> Context:
        return self.span.context()

    @property
    def span_context(self) -> SpanContext:
        return self.span.span_context

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        self.span.attributes.update(attributes)

    def add_link(self, span_context: SpanContext) -> None:
        links = self.span.links
        if isinstance(links, list):
            links.append(span_context)
        else:
            self.span.links = [span_context]

    @contextlib.contextmanager
    def active(
        self, finish: Callable[[], None] | None = None, end_reading: Callable[[], Reading | None] | None = None
    ) -> Iterator[SpanHandle]:
        """The span is the current context while the block runs (an `await` inside included) and
        ends when the block exits, with the block's exception if it raised; `finish` runs first;
        `end_reading` chooses the reading to end with (None from it: a fresh one)."""
        token = otel_context.attach(self.context())
        error = None
        try:
            yield self
        except BaseException as exc:
            error = exc
            raise
        finally:
            otel_context.detach(token)
            if finish is not None:
                finish()
            self.end(error=error, reading=end_reading() if end_reading is not None else None)

    def end(
        self,
        attributes: Mapping[str, Any] | None = None,
        error: BaseException | None = None,
        failed: str | None = None,
        reading: Reading | None = None,
    ) -> None:
        """`error`: what ended the call, if anything; a consumer closing a stream early is no error.
        `failed`: why the call failed without raising (an HTTP 5xx answer; `error.type` is `_OTHER` unless
        `attributes` name it). `reading`: end with this one instead of reading now. A span that ends in
        an error has status ERROR and `error.type`; one an exception ended, its `exception` event."""
        began = time.perf_counter_ns()
        span = self.span
        span.end_memory = (reading if reading is not None else self._telemetry.probe.read()).attributes
        if attributes:
            span.attributes.update(attributes)
        status = events = None
        if error is not None and not isinstance(error, GeneratorExit):
            span.attributes[sc.ERROR_TYPE] = sc.error_type(error)
            if isinstance(error, Exception):
                status = Status(StatusCode.ERROR, f"{type(error).__name__}: {error}")
                events = [exception_event(error)]
            else:
                status = Status(StatusCode.ERROR, type(error).__name__)
        elif failed is not None:
            status = Status(StatusCode.ERROR, failed)
            span.attributes.setdefault(sc.ERROR_TYPE, sc.ERROR_TYPE_OTHER)
        self._telemetry.recorder.end(span, status, events)
        if self._outer_heap_stage is not None:
            heap_tags = self._telemetry.heap_tags
            assert heap_tags is not None  # an outer stage is known only with the heap counter
            heap_tags.restore(self._outer_heap_stage)
        watch = self._telemetry.span_end_watch
        if watch is not None:  # after the end is recorded: what the watcher sets off comes after it
            watch(span.attributes.get(sc.STAGE), span.end_memory)
        self._telemetry.self_ns += time.perf_counter_ns() - began


class BoundedRegistry:
    """Keyed state with a hard size bound: the oldest entry is evicted (and handed to `on_evict`)."""

    def __init__(self, limit: int, on_evict: Callable[[Any], None] | None = None) -> None:
        self._items: collections.OrderedDict[Any, Any] = collections.OrderedDict()
        self._limit = limit
        self._on_evict = on_evict
        self._lock = threading.Lock()

    def put(self, key: Any, value: Any) -> None:
        evicted = []
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self._limit:
                evicted.append(self._items.popitem(last=False)[1])
        if self._on_evict is not None:
            for old in evicted:
                self._on_evict(old)

    def get(self, key: Any) -> Any:
        return self._items.get(key)

    def pop(self, key: Any) -> Any:
        with self._lock:
            return self._items.pop(key, None)

    def drain(self) -> list[Any]:
        with self._lock:
            values = list(self._items.values())
            self._items.clear()
        return values

    def __len__(self) -> int:
        return len(self._items)


class RequestState:
    """A request span between `preprocess` and the end of `generate`, and its engine stream's span
    (opened by the engine layer, closed by the request layer with `stream_attributes()` added)."""

    __slots__ = (
        "_text_room",
        "chunks",
        "detail",
        "first_chunk_ns",
        "handle",
        "input_messages",
        "last",
        "output_text",
        "response_end",
        "start_ns",
        "stream",
        "stream_attributes",
    )

    def __init__(
        self,
        handle: SpanHandle,
        start_ns: int | None = None,
        captured_text: int = 0,
        input_messages: list[dict[str, Any]] | None = None,
        detail: bool = True,
    ) -> None:
        """`start_ns`: when the request span started (monotonic), so TTFT and duration include preprocessing.
        `captured_text`: characters of response text to keep (the opt-in content capture; 0: none).
        `input_messages`: the prompt as the GenAI conventions give it, for the content event (None: no event).
        `detail`: the request records its stage detail (detail.py): its engine stream's span, the reading
        at its last output."""
        self.handle = handle
        self.detail = detail
        self.start_ns = time.monotonic_ns() if start_ns is None else start_ns
        self.first_chunk_ns: int | None = None
        self.chunks = 0
        self.last: Any = None  # the newest output: its token count and finish reason end the spans
        self.stream: SpanHandle | None = None
        self.stream_attributes: Callable[[], Mapping[str, Any]] | None = None
        self.output_text: list[str] | None = [] if captured_text else None
        self._text_room = captured_text
        self.response_end: Mapping[str, Any] | None = None  # the reading at the last output (request.py)
        self.input_messages = input_messages

    def saw(self, output: Any) -> None:
        """One output streamed to the caller; the first with a generated token marks the time to first token."""
        if self.first_chunk_ns is None and getattr(output, "generate_token_len", None):
            self.first_chunk_ns = time.monotonic_ns()
        self.chunks += 1
        self.last = output
        self.keep_text(output)

    def keep_text(self, output: Any) -> None:
        """An output's `response` (the text generated since the previous one), while there is room for it."""
        if self._text_room:
            text, kept = getattr(output, "response", None), self.output_text
            if isinstance(text, str) and kept is not None:  # kept: a list while there is room
                kept.append(text[: self._text_room])
                self._text_room -= len(kept[-1])


def _end_abandoned(state: RequestState) -> None:
    if state.stream is not None:
        state.stream.end()
    state.handle.end({sc.GEN_AI_RESPONSE_FINISH_REASONS: ["abandoned"]})


class Telemetry:
    """The shared state of one `instrument()` call."""

    MAX_OPEN_REQUESTS = 4096

    def __init__(self, recorder: SpanRecorder, probe: MemoryProbe, options: Options) -> None:
        self.recorder = recorder
        self.probe = probe
        self.options = options
        self.pipeline_contexts = BoundedRegistry(self.MAX_OPEN_REQUESTS)
        self.requests = BoundedRegistry(self.MAX_OPEN_REQUESTS, on_evict=_end_abandoned)
        self.self_ns = 0  # time spent starting and ending spans (probes included): vlmtrace's own cost
        # Called with each ending span's stage and end reading (the cache guard's; None: nothing watches).
        self.span_end_watch: Callable[[str | None, Mapping[str, Any]], None] | None = None
        # Finished requests for the metrics (a bounded deque, drained off the request path); None: metrics off.
        self.finished: collections.deque | None = None
        # Request spans of another process (the api_server's, seen from the PyTorch engine's process), by session.
        self.remote_requests = BoundedRegistry(self.MAX_OPEN_REQUESTS)
        # The heap counter's charges by allocating stage (None: not preloaded): each span's start says which
        # stage its context works in, its end gives the context back to the stage around it.
        self.heap_tags = probe.stage_tags
        # Which requests record their stage detail (detail.py); None: every request does (`detail_every` 1).
        self.detail: DetailSampling | None = None

    def start(
        self,
        name: str,
        stage: str,
        attributes: Mapping[str, Any] | None = None,
        context: SpanHandle | Context | None = None,
        links: Sequence[SpanContext] | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        start_time: int | None = None,
        start_reading: Reading | None = None,
    ) -> SpanHandle:
        """`context`: the parent — a span of ours, a context (an empty `Context()` for a new trace), or
        None for the current context."""
        began = time.perf_counter_ns()
        reading = start_reading if start_reading is not None else self.probe.read()
        span_attributes = {sc.STAGE: stage}
        if attributes:
            span_attributes.update(attributes)
        parent = context.span if isinstance(context, SpanHandle) else context
        span = self.recorder.start(name, parent, kind, span_attributes, links, start_time, reading.attributes)
        outer = self.heap_tags.enter(stage) if self.heap_tags is not None else None
        self.self_ns += time.perf_counter_ns() - began
        return SpanHandle(span, self, outer)

    def detail_skipped(self) -> bool:
        """Whether the request whose code runs here records no stage detail (detail.py)."""
        return self.detail is not None and otel_context.get_value(NO_DETAIL_KEY) is True

    def heap_stage(self, stage: str) -> None:
        """This context's allocations are `stage`'s from now on (heap counter only): the request's own
        moments that have no span (the prompt's end, the last output)."""
        if self.heap_tags is not None:
            self.heap_tags.enter(stage)

    def request_in_context(self) -> RequestState | None:
        """The open request whose whole-request `generate` is running here (before 0.16)."""
        return self.requests.get(otel_context.get_value(SESSION_KEY))

    def request_span_context(self, session_id: Any) -> SpanContext | None:
        state = self.requests.get(session_id)
        return state.handle.span_context if state is not None else self.remote_requests.get(session_id)

    def close_open_requests(self) -> None:
        for state in self.requests.drain():
            _end_abandoned(state)


async def relay(
    outputs: Any,
    on_output: Callable[[Any], None],
    on_close: Callable[[BaseException | None], None],
    context: Context | None = None,
) -> AsyncIterator[Any]:
    """Every output of an async generator, passed on. Once it is closed (exhausted, failed, or closed
    early by its consumer: GeneratorExit), `on_close` gets the exception that ended it, if any.
    `context`: the OpenTelemetry context the generator's own code runs in (attached around each step).
    Return it from a plain wrapper: the consumer's `aclose()` then reaches it at once, where an async
    generator wrapping it would leave it to the garbage collector."""
    error = None
    try:
        while True:
            token = otel_context.attach(context) if context is not None else None
            try:
                output = await outputs.__anext__()
            except StopAsyncIteration:
                break
            finally:
                if token is not None:
                    otel_context.detach(token)
            on_output(output)
            yield output
    except BaseException as exc:
        error = exc
        raise
    finally:
        await outputs.aclose()
        on_close(error)


def sync_span(
    telemetry: Telemetry,
    span_name: str,
    stage: str,
    extract: Callable[[Any, tuple, dict], dict[str, Any]] | None = None,
    root: bool = False,
) -> Wrapper:
    """A wrapper for a synchronous call: one span around it, current while it runs. `root`: the span
    starts a trace of its own (housekeeping that serves no one request, whichever request's code called it)."""

    def wrapper(wrapped, instance, args, kwargs):
        attributes = safe(extract, instance, args, kwargs) if extract is not None else None
        with telemetry.start(span_name, stage, attributes, context=Context() if root else None).active():
            return wrapped(*args, **kwargs)

    return wrapper
