"""Synthetic vlmtrace journals with a known cause, rate and stage of memory growth.

A small discrete-event simulation of an LMDeploy VLM pipeline: pipeline calls of `batch` prompts,
each prompt a `chat {model}` request whose vision work runs on one worker (serialised) while engine
streams overlap. Memory follows simple allocator rules: torch's caching allocator keeps its
high-water mark (reserved grows only when the cache cannot hold an allocation), vision outputs are
handed to the request and freed at its end, and each configured cause retains bytes inside its stage.
Journal records follow docs/journal.md exactly; `journal_to_otlp` converts one to collector-style OTLP JSON.
"""

from __future__ import annotations

import dataclasses
import gzip
import heapq
import itertools
import random
from collections.abc import Callable
from pathlib import Path

import orjson

from vlmtrace import semconv as sc

MiB = 1 << 20
GiB = 1 << 30
NS = 1_000_000_000
IMAGE_SIZES = ((448, 448), (640, 480), (800, 600), (1024, 768), (1280, 720), (1344, 1008), (1920, 1080))
COMPONENTS = ("tensor", "cache", "native", "host")
HOSTILE = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=1">'
FAULTHANDLER_BLOCK = """Fatal Python error: Aborted

Thread 0x00007f3a5effd640 (most recent call first):
  File "/usr/lib/python3.11/site-packages/lmdeploy/vl/engine.py", line 87 in forward
  File "/usr/lib/python3.11/concurrent/futures/thread.py", line 58 in run

Current thread 0x00007f3a9c1f4740 (most recent call first):
  File "/usr/lib/python3.11/site-packages/lmdeploy/turbomind/turbomind.py", line 612 in async_stream_infer
  File "/app/batch.py", line 14 in <module>

Extension modules: numpy.core._multiarray_umath, torch._C (total: 2)
"""


@dataclasses.dataclass
class Scenario:
    """What to simulate. `rates` are retained bytes per request per component, at `stages[component]`."""

    requests: int = 240
    batch: int = 1
    rates: dict[str, float] = dataclasses.field(default_factory=dict)
    stages: dict[str, str] = dataclasses.field(default_factory=dict)
    pixel_driven: tuple[str, ...] = ()
    devices: int = 1
    device_shares: tuple[float, ...] = (1.0,)
    device_totals: tuple[int, ...] = (80 * GiB,)
    crash_at_request: int | None = None
    empty_cache_every: int | None = None  # pipeline calls between the application's empty_cache calls
    torch_present: bool = True
    hostile: bool = False
    seed: int = 0
    gap_s: float = 0.03
    output_tokens: tuple[int, int] = (16, 64)
    continuous_sizes: bool = False  # image widths from a log-normal: a new largest image every so often
    sampled_nvml: bool = False  # as vlmtrace's recorder does: spans repeat the latest sample's NVML and RSS keys
    steady: bool = False  # the next call starts when the first request of this one ends: never idle
    prompt_end_readings: bool = False  # as vlmtrace 0.1 on LMDeploy 0.16+: a reading where prompt processing ends
    # Growth that is not a leak, per component: bytes kept by the first request, halving every `warmup_half_life`
    # requests (warm-up: caches filling, allocator pools growing to their working size).
    warmup: dict[str, float] = dataclasses.field(default_factory=dict)
    warmup_half_life: float = 40.0
    step: tuple[str, int, float] | None = None  # (component, request, bytes): kept once, by that request
    # Per component: (request, rate) pairs, in order: from that request on, the leak keeps that rate instead of
    # `rates`' (a leak that begins, changes its rate or stops within the run).
    rate_changes: dict[str, tuple[tuple[int, float], ...]] = dataclasses.field(default_factory=dict)
    sample_interval_s: float = 0.1
    # The cache guard (trim_cache): at a sample whose torch cache (reserved − allocated) exceeds this many
    # bytes, a trim on the sampler's thread releases it, at most once per `trim_interval_s`.
    trim_cache_bytes: float | None = None
    trim_interval_s: float = 2.0
    model: str = "tiny-vlm"
    # "pytorch": the request's engine work is one lmdeploy.pytorch.forward span (a rough stand-in for the
    # PyTorch engine's steps, enough for rules that depend on the backend)
    backend: str = "turbomind"
    pid: int = 4242
    host: str = "gpu-node-1"


@dataclasses.dataclass
class Truth:
    """What the analysis should find."""

    rates: dict[str, float]
    stages: dict[str, str]
    requests: int
    spans: int
    crashed: bool
    in_flight: list[str]


class _Memory:
    """Process memory on `devices` GPUs plus host RSS, with torch's caching-allocator rule."""

    def __init__(self, scenario: Scenario, rng: random.Random) -> None:
        self.n = scenario.devices
        self.shares = scenario.device_shares
        self.totals = scenario.device_totals
        self.rng = rng
        self.torch = scenario.torch_present
        self.allocated = 900 * MiB  # vision weights on device 0
        self.reserved = 1024 * MiB
        self.inactive_split = 0
        self.retries = 0
        self.native = [6 * GiB + d * 512 * MiB for d in range(self.n)]  # TurboMind weights + KV pool
        self.others = [2 * GiB for _ in range(self.n)]  # other processes on the device
        self.rss = 3 * GiB

    def torch_alloc(self, size: float) -> None:
        self.allocated += size
        if self.allocated > self.reserved:
            self.reserved = self.allocated + 2 * MiB

    def torch_free(self, size: float) -> None:
        self.allocated -= size

    def fragment(self, size: float) -> None:
        """Cache retention: a new segment that later allocations cannot reuse."""
        self.reserved += size
        self.inactive_split += 0.8 * size
        if self.rng.random() < 0.05:
            self.retries += 1

    def empty_cache(self) -> None:
        self.reserved = self.allocated + 2 * MiB
        self.inactive_split = 0

    def native_add(self, size: float) -> None:
        for device in range(self.n):
            self.native[device] += size * self.shares[device]

    def readings(self) -> dict:
        jitter_native = [self.rng.gauss(0, 192 * 1024) for _ in range(self.n)]
        native = [self.native[d] + jitter_native[d] for d in range(self.n)]
        reserved = [self.reserved if d == 0 else 0 for d in range(self.n)]
        allocated = [self.allocated if d == 0 else 0 for d in range(self.n)]
        split = [self.inactive_split if d == 0 else 0 for d in range(self.n)]
        process = [native[d] + (reserved[d] if self.torch else 0) for d in range(self.n)]
        used = [process[d] + self.others[d] for d in range(self.n)]
        values = {
            sc.MEM_GPU_PROCESS: sum(process),
            sc.MEM_GPU_USED: sum(used),
            sc.MEM_GPU_TOTAL: sum(self.totals),
            sc.MEM_NATIVE: sum(native) if self.torch else sum(process),
            sc.MEM_HOST_RSS: self.rss + self.rng.gauss(0, 1.5 * MiB),
        }
        if self.torch:
            values.update(
                {
                    sc.MEM_TORCH_ALLOCATED: self.allocated,
                    sc.MEM_TORCH_RESERVED: self.reserved,
                    sc.MEM_TORCH_INACTIVE_SPLIT: self.inactive_split,
                    sc.MEM_TORCH_ALLOC_RETRIES: self.retries,
                    sc.MEM_TORCH_OOMS: 0,
                }
            )
        readings = {key: int(value) for key, value in values.items()}
        readings[sc.MEM_DEVICES] = list(range(self.n))
        if self.n > 1:
            per_device = {
                sc.MEM_GPU_PROCESS: process,
                sc.MEM_GPU_USED: used,
                sc.MEM_GPU_TOTAL: list(self.totals),
                sc.MEM_NATIVE: native,
            }
            if self.torch:
                per_device.update(
                    {
                        sc.MEM_TORCH_ALLOCATED: allocated,
                        sc.MEM_TORCH_RESERVED: reserved,
                        sc.MEM_TORCH_INACTIVE_SPLIT: split,
                    }
                )
            for key, values_per_device in per_device.items():
                readings[key + sc.PER_DEVICE_SUFFIX] = [int(v) for v in values_per_device]
        return readings


def _thread(stage: str) -> str:
    if stage.startswith("vision"):
        return "vision-worker"
    return "vlmtrace-sampler" if stage == sc.STAGE_CACHE_TRIM else "MainThread"


@dataclasses.dataclass
class _Span:
    name: str
    stage: str
    start: int
    end: int
    trace_id: str
    span_id: str
    parent: _Span | None
    attributes: dict
    start_readings: dict | None = None


class _Simulation:
    def __init__(self, scenario: Scenario, emit: Callable[[dict], None]) -> None:
        self.s = scenario
        self.emit = emit
        self.rng = random.Random(scenario.seed)
        self.memory = _Memory(scenario, self.rng)
        self.events: list = []
        self.counter = itertools.count()
        self.ids = itertools.count(1)
        self.spans = 0
        self.ended = 0
        self.open: dict[str, _Span] = {}
        self.model = HOSTILE if scenario.hostile else scenario.model
        self.next_sample = 1_760_000_000 * NS + NS // 20
        self.last_sample: dict = {}
        self.last_trim: int | None = None
        self.trimmed = False  # a trim happened since the last pipeline call was planned

    def _id(self, digits: int) -> str:
        return f"{self.rng.getrandbits(digits * 4 - 8):0{digits - 2}x}{next(self.ids) % 256:02x}"

    def at(self, t: int, action: Callable[[], None]) -> None:
        heapq.heappush(self.events, (t, next(self.counter), action))

    def span(
        self, name: str, stage: str, start: int, end: int, parent: _Span | None, attributes: dict | None = None
    ) -> _Span:
        trace_id = parent.trace_id if parent else self._id(32)
        span = _Span(name, stage, start, end, trace_id, self._id(16), parent, dict(attributes or {}))
        span.attributes[sc.STAGE] = stage
        self.at(start, lambda: self._start(span))
        self.at(end, lambda: self._end(span))
        self.spans += 1
        return span

    def _start(self, span: _Span) -> None:
        span.start_readings = self._span_readings()
        self.open[span.span_id] = span
        self.emit(
            {
                "k": "start",
                "t": span.start,
                "trace_id": span.trace_id,
                "span_id": span.span_id,
                "parent_id": span.parent.span_id if span.parent else None,
                "name": span.name,
                "kind": "INTERNAL",
                "thread": _thread(span.stage),
                "attrs": {**span.attributes, **span.start_readings},
                "links": [],
            }
        )

    def _end(self, span: _Span) -> None:
        readings = self._span_readings()
        attributes = {**span.attributes, **readings}
        for key in sc.MEM_DELTA_KEYS:
            if key in readings and key in span.start_readings:
                attributes[key + sc.DELTA_SUFFIX] = readings[key] - span.start_readings[key]
        del self.open[span.span_id]
        self.ended += 1
        self.emit(
            {
                "k": "end",
                "t": span.end,
                "start": span.start,
                "trace_id": span.trace_id,
                "span_id": span.span_id,
                "parent_id": span.parent.span_id if span.parent else None,
                "name": span.name,
                "kind": "INTERNAL",
                "status": "OK",
                "status_message": HOSTILE if self.s.hostile else "",
                "attrs": attributes,
                "events": [],
                "links": [],
            }
        )

    def retain(self, component: str, stage: str, span: _Span, pixels: int, mean_pixels: float, index: int) -> None:
        rate = self.s.rates.get(component)
        for start, changed in self.s.rate_changes.get(component, ()):
            if index >= start:
                rate = changed
        if not rate or self.s.stages.get(component) != stage:
            return
        amount = rate * (pixels / mean_pixels if component in self.s.pixel_driven else 1.0)
        amount *= self.rng.uniform(0.9, 1.1)
        memory = self.memory
        action = {
            "tensor": lambda: memory.torch_alloc(amount),
            "cache": lambda: memory.fragment(amount),
            "native": lambda: memory.native_add(amount),
            "host": lambda: setattr(memory, "rss", memory.rss + amount),
        }[component]
        # Prompt processing is code on the request's own task, right where the request starts; other
        # stages do their work 60% of the way through.
        when = span.start + 60_000 if stage == sc.STAGE_PROMPT else span.start + int((span.end - span.start) * 0.6)
        self.at(when, action)

    def keep(self, component: str, amount: float, when: int) -> None:
        """Bytes kept by one component at one moment (warm-up and one-off steps: not a leak's steady rate)."""
        memory = self.memory
        action = {
            "tensor": lambda: memory.torch_alloc(amount),
            "native": lambda: memory.native_add(amount),
            "host": lambda: setattr(memory, "rss", memory.rss + amount),
        }[component]
        self.at(when, action)

    def record_prompt_end(self, chat: _Span) -> None:
        readings = self._span_readings()
        chat.attributes.update(
            {prompt_key: readings[key] for key, prompt_key in sc.PROMPT_END_KEYS.items() if key in readings}
        )

    def _sample(self, t: int) -> None:
        self.last_sample = self.memory.readings()
        self.emit({"k": "sample", "t": t, "attrs": self.last_sample})
        bound, memory = self.s.trim_cache_bytes, self.memory
        due = self.last_trim is None or t - self.last_trim >= self.s.trim_interval_s * NS
        if bound is not None and due and memory.reserved - memory.allocated > bound:
            self.last_trim = t
            trim = self.span(sc.SPAN_CACHE_TRIM, sc.STAGE_CACHE_TRIM, t + 50_000, t + 4_000_000, None)
            self.at(trim.start + 2_000_000, memory.empty_cache)
            self.trimmed = True

    def _span_readings(self) -> dict:
        readings = self.memory.readings()
        if self.s.sampled_nvml and self.last_sample:
            readings.update(
                {key: value for key, value in self.last_sample.items() if not key.startswith("vlmtrace.mem.torch.")}
            )
        return readings

    def _run_until(self, until: int) -> None:
        """Play every event before `until`, with the background samples due by then."""
        interval = int(self.s.sample_interval_s * NS)
        while self.next_sample < until:
            self.at(self.next_sample, lambda st=self.next_sample: self._sample(st))
            self.next_sample += interval
        while self.events and self.events[0][0] < until:
            _, _, action = heapq.heappop(self.events)
            action()

    def run(self) -> Truth:
        s, memory = self.s, self.memory
        mean_pixels = sum(w * h for w, h in IMAGE_SIZES) / len(IMAGE_SIZES)
        self.emit(
            {
                "k": "header",
                "v": 1,
                "t": 1_760_000_000 * NS,
                "pid": s.pid,
                "ppid": 1,
                "host": s.host,
                "seq": 0,
                "resource": {"service.name": "lmdeploy", "host.name": s.host, "process.pid": s.pid},
                "versions": {"vlmtrace": "0.1.0", "lmdeploy": "0.6.1", "torch": "2.2.1", "python": "3.11"},
                "argv": ["triton_backend.py"],
            }
        )
        t = 1_760_000_000 * NS + NS // 10
        vision_cursor = t
        crash_time = None
        in_flight: list[str] = []
        request = 0
        calls = 0
        while request < s.requests:
            prompts = min(s.batch, s.requests - request)
            pipeline_start = t
            after_empty_cache = self.trimmed or (
                calls > 0 and s.empty_cache_every is not None and calls % s.empty_cache_every == 0
            )
            self.trimmed = False
            calls += 1
            chats = []
            batch_end = t
            for j in range(prompts):
                if s.continuous_sizes:
                    width = min(3000, max(224, int(self.rng.lognormvariate(6.7, 0.3))))
                    height = width * 3 // 4
                else:
                    width, height = self.rng.choice(IMAGE_SIZES)
                pixels = width * height
                tokens = pixels // (28 * 28)
                output_tokens = self.rng.randint(*s.output_tokens)
                chat_start = t + 200_000 * (j + 1)
                vision_cursor = max(vision_cursor, chat_start + 100_000)
                pre_start = vision_cursor
                vp_end = pre_start + int(1.5e6 + pixels * 2)
                fwd_start = vp_end + 100_000
                fwd_end = fwd_start + int(4e6 + pixels * 8) + (12_000_000 if after_empty_cache and j == 0 else 0)
                wrap_end = fwd_end + 400_000
                pre_end = wrap_end + 100_000
                vision_cursor = pre_end
                stream_end = pre_end + output_tokens * 1_500_000 + self.rng.randint(0, 4_000_000)
                chat_end = stream_end + 300_000
                batch_end = max(batch_end, chat_end)
                chats.append(
                    (
                        request,
                        chat_start,
                        chat_end,
                        pixels,
                        tokens,
                        output_tokens,
                        pre_start,
                        vp_end,
                        fwd_start,
                        fwd_end,
                        wrap_end,
                        pre_end,
                        stream_end,
                        width,
                        height,
                    )
                )
                request += 1
            pipeline = self.span(
                sc.SPAN_PIPELINE_INFER,
                sc.STAGE_PIPELINE,
                pipeline_start,
                batch_end + 500_000,
                None,
                {sc.PIPELINE_PROMPTS: prompts, sc.PIPELINE_IMAGES: prompts},
            )
            for (
                index,
                chat_start,
                chat_end,
                pixels,
                tokens,
                output_tokens,
                pre_start,
                vp_end,
                fwd_start,
                fwd_end,
                wrap_end,
                pre_end,
                stream_end,
                width,
                height,
            ) in chats:
                chat = self.span(
                    f"chat {self.model}",
                    sc.STAGE_REQUEST,
                    chat_start,
                    chat_end,
                    pipeline,
                    {
                        sc.GEN_AI_OPERATION_NAME: "chat",
                        sc.GEN_AI_PROVIDER_NAME: sc.GEN_AI_PROVIDER,
                        sc.GEN_AI_REQUEST_MODEL: self.model,
                        sc.GEN_AI_USAGE_INPUT_TOKENS: tokens + 20,
                        sc.GEN_AI_USAGE_OUTPUT_TOKENS: output_tokens,
                        sc.REQUEST_IMAGES: 1,
                        sc.REQUEST_IMAGE_PIXELS: pixels,
                        sc.LMDEPLOY_BACKEND: s.backend,
                        sc.LMDEPLOY_SESSION_ID: index,
                        sc.REQUEST_PREPROCESS_DURATION: (pre_end - chat_start) / 1e9,
                    },
                )
                vision_attrs = {sc.VISION_IMAGES: 1, sc.VISION_PIXELS: pixels, sc.VISION_MAX_BATCH_SIZE: 1}
                vpre = self.span(
                    sc.SPAN_VISION_PREPROCESS,
                    sc.STAGE_VISION_PREPROCESS,
                    pre_start + 50_000,
                    vp_end,
                    chat,
                    {
                        **vision_attrs,
                        sc.VISION_IMAGE_WIDTHS: [width],
                        sc.VISION_IMAGE_HEIGHTS: [height],
                        sc.VISION_TOKENS: tokens,
                    },
                )
                infer = self.span(
                    sc.SPAN_VISION_INFER,
                    sc.STAGE_VISION_INFER,
                    fwd_start - 50_000,
                    fwd_end + 50_000,
                    chat,
                    vision_attrs,
                )
                forward = self.span(
                    sc.SPAN_VISION_FORWARD,
                    sc.STAGE_VISION_FORWARD,
                    fwd_start,
                    fwd_end,
                    infer,
                    {**vision_attrs, sc.VISION_MODULE: "SiglipVisionModel"},
                )
                wrap = self.span(
                    sc.SPAN_VISION_INFER,
                    HOSTILE if s.hostile else sc.STAGE_VISION_INFER,
                    fwd_end + 100_000,
                    wrap_end,
                    chat,
                    vision_attrs,
                )
                pytorch = s.backend == "pytorch"
                stream = self.span(
                    sc.SPAN_PYTORCH_FORWARD if pytorch else sc.SPAN_TURBOMIND_STREAM,
                    sc.STAGE_ENGINE_FORWARD if pytorch else sc.STAGE_ENGINE_STREAM,
                    pre_end + 100_000,
                    stream_end,
                    chat,
                    {sc.GEN_AI_USAGE_INPUT_TOKENS: tokens + 20, sc.GEN_AI_USAGE_OUTPUT_TOKENS: output_tokens},
                )
                activations = pixels * 96
                embedding = tokens * 3584 * 2
                decoded = pixels * 3
                self.at(vpre.start + 10_000, lambda d=decoded: setattr(memory, "rss", memory.rss + d))
                self.at(vpre.end - 10_000, lambda d=decoded: setattr(memory, "rss", memory.rss - d))
                self.at(forward.start + 10_000, lambda a=activations: memory.torch_alloc(a))
                self.at(forward.end - 20_000, lambda a=activations: memory.torch_free(a))
                self.at(forward.end - 10_000, lambda e=embedding: memory.torch_alloc(e))
                self.at(chat.end - 10_000, lambda e=embedding: memory.torch_free(e))
                for component in COMPONENTS:
                    for stage_span in (vpre, forward, wrap, stream, chat):
                        self.retain(component, stage_span.stage, stage_span, pixels, mean_pixels, index)
                    self.retain(component, sc.STAGE_PROMPT, chat, pixels, mean_pixels, index)
                for component, first in s.warmup.items():
                    self.keep(component, first * 0.5 ** (index / s.warmup_half_life), vpre.start + 20_000)
                if s.step is not None and s.step[1] == index:
                    self.keep(s.step[0], s.step[2], vpre.start + 20_000)
                if s.prompt_end_readings:
                    self.at(pre_end, lambda c=chat: self.record_prompt_end(c))
                if s.crash_at_request == index:
                    crash_time = forward.start + (forward.end - forward.start) // 2
            if s.steady:
                t = min(chat[2] for chat in chats)
            else:
                t = pipeline.end + int(s.gap_s * NS * self.rng.uniform(0.5, 1.5))
            if s.empty_cache_every is not None and calls % s.empty_cache_every == 0:
                empty = self.span(sc.SPAN_EMPTY_CACHE, sc.STAGE_EMPTY_CACHE, t, t + 6_000_000, None)
                self.at(empty.start + 3_000_000, memory.empty_cache)
                t = empty.end + 1_000_000
            if crash_time is not None:
                break
            self._run_until(t)
        end_time = crash_time if crash_time is not None else t
        self._run_until(end_time + 1)
        if crash_time is not None:
            in_flight = [span.name for span in self.open.values()]
        else:
            self.emit(
                {
                    "k": "end_marker",
                    "t": end_time,
                    "clean": True,
                    "spans_started": self.spans,
                    "spans_ended": self.spans,
                }
            )
        return Truth(
            rates=dict(s.rates),
            stages=dict(s.stages),
            requests=request,
            spans=self.ended,
            crashed=crash_time is not None,
            in_flight=in_flight,
        )


def write_journal(scenario: Scenario, path: str | Path, compress: bool = False) -> Truth:
    """Simulate `scenario` and write its journal to `path` (gzip when `compress`)."""
    path = Path(path)
    opener = gzip.open if compress else open
    with opener(path, "wb") as handle:
        simulation = _Simulation(scenario, lambda record: handle.write(orjson.dumps(record) + b"\n"))
        truth = simulation.run()
        if truth.crashed:
            handle.write(b'{"k":"end","t":17600000')
            handle.write(b"\n" + FAULTHANDLER_BLOCK.encode())
    return truth


def _any_value(value: object) -> dict:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, list):
        return {"arrayValue": {"values": [_any_value(item) for item in value]}}
    return {"stringValue": str(value)}


def journal_to_otlp(journal: str | Path, otlp: str | Path, spans_per_line: int = 512) -> int:
    """Rewrite a journal's ended spans as the collector's file exporter would: one request per line."""
    resource: dict = {}
    spans: list[dict] = []
    lines = 0
    with open(journal, "rb") as source, open(otlp, "wb") as target:

        def flush() -> None:
            nonlocal lines
            if spans:
                request = {
                    "resourceSpans": [
                        {
                            "resource": {
                                "attributes": [{"key": k, "value": _any_value(v)} for k, v in resource.items()]
                            },
                            "scopeSpans": [{"scope": {"name": "vlmtrace", "version": "0.1.0"}, "spans": list(spans)}],
                        }
                    ]
                }
                target.write(orjson.dumps(request) + b"\n")
                spans.clear()
                lines += 1

        for line in source:
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if record.get("k") == "header":
                resource = dict(record["resource"])
            elif record.get("k") == "end":
                span = {
                    "traceId": record["trace_id"],
                    "spanId": record["span_id"],
                    "name": record["name"],
                    "kind": 1,
                    "startTimeUnixNano": str(record["start"]),
                    "endTimeUnixNano": str(record["t"]),
                    "attributes": [{"key": k, "value": _any_value(v)} for k, v in record["attrs"].items()],
                    "status": {"code": {"UNSET": 0, "OK": 1, "ERROR": 2}[record["status"]]},
                }
                if record.get("parent_id"):
                    span["parentSpanId"] = record["parent_id"]
                spans.append(span)
                if len(spans) >= spans_per_line:
                    flush()
        flush()
    return lines
