"""Span names and attribute keys: the one place the trace schema is spelled.

Every key here is documented in docs/schema.md. The analyzer reads traces with these
names, so renaming one is a schema change: change it here, in the docs and in the
dashboards together.
"""

from collections.abc import Mapping
from typing import Any

# The instrumentation scope of every span vlmtrace records.
INSTRUMENTATION_SCOPE = "vlmtrace"
# The semantic conventions release the GenAI and hardware names below follow (the scope's schema_url).
SCHEMA_URL = "https://opentelemetry.io/schemas/1.37.0"

# Span names (low cardinality; the request span follows the GenAI convention `chat {model}`).
SPAN_PIPELINE_INFER = "lmdeploy.pipeline.infer"
SPAN_PIPELINE_STREAM_INFER = "lmdeploy.pipeline.stream_infer"
SPAN_PIPELINE_CHAT = "lmdeploy.pipeline.chat"
SPAN_REQUEST_OPERATION = "chat"  # request spans are named f"chat {model}"
SPAN_VISION_PREPROCESS = "lmdeploy.vision.preprocess"
SPAN_VISION_INFER = "lmdeploy.vision.infer"
SPAN_VISION_FORWARD = "lmdeploy.vision.forward"
SPAN_TURBOMIND_STREAM = "lmdeploy.turbomind.stream"
SPAN_PYTORCH_FORWARD = "lmdeploy.pytorch.forward"
SPAN_EMPTY_CACHE = "torch.cuda.empty_cache"  # the user's own calls, timed: what the workaround costs
SPAN_VISION_BATCH = "lmdeploy.vision.batch"  # 0.4–0.6.4: the encoder's own batch of images from any requests
SPAN_CACHE_TRIM = "vlmtrace.cache.trim"  # the cache guard (trim_cache) releasing torch's cache, off the request path
# LMDeploy's PyTorch engine trimming host memory (gc.collect() and malloc_trim(0)) every 128 multimodal sessions
SPAN_HEAP_TRIM = "lmdeploy.pytorch.heap_trim"

# Stage: the analyzer attributes memory growth to these values.
STAGE = "vlmtrace.stage"
STAGE_PIPELINE = "pipeline"
STAGE_REQUEST = "request"
STAGE_PROMPT = "request.prompt"  # derived by the analyzer from PROMPT_END_KEYS, never a span of its own
STAGE_RESPONSE = "request.response"  # after the last output (RESPONSE_END_KEYS), likewise never a span
STAGE_VISION_PREPROCESS = "vision.preprocess"
STAGE_VISION_INFER = "vision.infer"
STAGE_VISION_FORWARD = "vision.forward"
STAGE_ENGINE_STREAM = "engine.stream"
STAGE_ENGINE_FORWARD = "engine.forward"
STAGE_EMPTY_CACHE = "empty_cache"
STAGE_VISION_BATCH = "vision.batch"
STAGE_CACHE_TRIM = "cache.trim"
STAGE_HEAP_TRIM = "heap_trim"
# Derived by the analyzer for a request whose stage detail was not recorded (REQUEST_DETAIL_SKIPPED): what it
# did is charged here, never a stage a verdict names.
STAGE_WITHOUT_DETAIL = "request.without_detail"

# GenAI semantic conventions (request span).
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
GEN_AI_REQUEST_TOP_K = "gen_ai.request.top_k"
GEN_AI_REQUEST_SEED = "gen_ai.request.seed"
GEN_AI_REQUEST_STOP_SEQUENCES = "gen_ai.request.stop_sequences"
GEN_AI_REQUEST_STREAM = "gen_ai.request.stream"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"  # only where capture_content asks for content (span, event)
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"  # only where capture_content asks for content (span, event)
GEN_AI_PROVIDER = "lmdeploy"

# LMDeploy-specific facts (not vlmtrace measurements).
LMDEPLOY_BACKEND = "lmdeploy.backend"
LMDEPLOY_SESSION_ID = "lmdeploy.session_id"
LMDEPLOY_TM_ACTIVE_SEQS = "lmdeploy.turbomind.active_seqs"
LMDEPLOY_TM_WAITING_SEQS = "lmdeploy.turbomind.waiting_seqs"
LMDEPLOY_TM_CACHE_USAGE = "lmdeploy.turbomind.cache_usage"
LMDEPLOY_TM_SCHEDULER_TICK = "lmdeploy.turbomind.scheduler_tick"

# Pipeline call.
PIPELINE_PROMPTS = "vlmtrace.pipeline.prompts"
PIPELINE_IMAGES = "vlmtrace.pipeline.images"

# Request.
REQUEST_TTFT = "vlmtrace.request.time_to_first_token"
REQUEST_PREPROCESS_DURATION = "vlmtrace.request.preprocess_duration"
REQUEST_OUTPUT_CHUNKS = "vlmtrace.request.output_chunks"
REQUEST_IMAGES = "vlmtrace.request.images"
REQUEST_IMAGE_PIXELS = "vlmtrace.request.image_pixels"
# 1 on a request span whose stage detail was not recorded (`detail_every`): no vision or engine-stream spans
# under it, no readings where its prompt ended or where it answered, no sampling parameters.
REQUEST_DETAIL_SKIPPED = "vlmtrace.request.detail_skipped"

# Vision encoder.
VISION_IMAGES = "vlmtrace.vision.images"
VISION_IMAGE_WIDTHS = "vlmtrace.vision.image_widths"
VISION_IMAGE_HEIGHTS = "vlmtrace.vision.image_heights"
VISION_PIXELS = "vlmtrace.vision.pixels"
VISION_TOKENS = "vlmtrace.vision.tokens"
VISION_MAX_BATCH_SIZE = "vlmtrace.vision.max_batch_size"
VISION_INPUT_SHAPE = "vlmtrace.vision.input_shape"
VISION_MODULE = "vlmtrace.vision.module"

# Engine streams and steps.
ENGINE_OUTPUT_CHUNKS = "vlmtrace.engine.output_chunks"
STEP_KIND = "vlmtrace.step.kind"  # "prefill" | "decode"
STEP_SEQUENCES = "vlmtrace.step.sequences"
STEP_TOKENS = "vlmtrace.step.tokens"
STEP_KV_TOKENS = "vlmtrace.step.kv_tokens"
STEP_KV_BLOCKS = "vlmtrace.step.kv_blocks"
STEP_SESSION_IDS = "vlmtrace.step.session_ids"
STEP_SCHEDULE_SECONDS = "vlmtrace.step.schedule_seconds"
STEP_COUNT = "vlmtrace.step.count"  # steps a span covers: a decode run's

# The cache guard's trim (span vlmtrace.cache.trim): why it ran and what it released. Its memory
# readings (start: just before torch.cuda.empty_cache(), end: just after) are full samples.
CACHE_TRIM_BOUND = "vlmtrace.cache.trim.bound"  # "cached" | "headroom" (config.CacheBound)
CACHE_TRIM_LIMIT = "vlmtrace.cache.trim.limit"  # the bound's bytes
CACHE_TRIM_DEVICE = "vlmtrace.cache.trim.device"  # NVML index of the device whose reading crossed it
CACHE_TRIM_CACHED = "vlmtrace.cache.trim.cached"  # that device's torch reserved − allocated in the triggering sample
CACHE_TRIM_FREE = "vlmtrace.cache.trim.free"  # that device's free memory (NVML total − used) in it, when read
CACHE_TRIM_TRIGGER_TIME = "vlmtrace.cache.trim.trigger_time"  # when the triggering sample was read (unix ns)
CACHE_TRIM_RELEASED = "vlmtrace.cache.trim.released"  # torch reserved before − after, summed over devices

# The thread a span started on (OpenTelemetry's general attribute). The journal keeps it on start
# records; the analyzer reads it to know which spans could run at the same time (docs/analysis.md).
THREAD_NAME = "thread.name"

# Memory readings. On a span start record the value is the reading at start; on an end
# record (and in OTLP, which only carries ended spans) it is the reading at end, and the
# key with DELTA_SUFFIX holds end - start. Scalars are sums over the probed devices;
# with more than one device, PER_DEVICE_SUFFIX keys hold one value per entry of MEM_DEVICES.
DELTA_SUFFIX = ".delta"
PER_DEVICE_SUFFIX = ".per_device"
MEM_DEVICES = "vlmtrace.mem.devices"
MEM_TORCH_ALLOCATED = "vlmtrace.mem.torch.allocated"
MEM_TORCH_RESERVED = "vlmtrace.mem.torch.reserved"
MEM_TORCH_INACTIVE_SPLIT = "vlmtrace.mem.torch.inactive_split"
MEM_TORCH_ALLOC_RETRIES = "vlmtrace.mem.torch.alloc_retries"
MEM_TORCH_OOMS = "vlmtrace.mem.torch.ooms"
MEM_GPU_PROCESS = "vlmtrace.mem.gpu.process"
MEM_GPU_USED = "vlmtrace.mem.gpu.used"
MEM_GPU_TOTAL = "vlmtrace.mem.gpu.total"
MEM_NATIVE = "vlmtrace.mem.native"
MEM_HOST_RSS = "vlmtrace.mem.host.rss"
# Heap bytes in use (malloc's chunks), only in a process started with the heap counter preloaded
# (`vlmtrace run --heap-counter`, probes/heap.py): it changes where memory is kept, RSS where pages are touched.
MEM_HOST_HEAP = "vlmtrace.mem.host.heap"
# When the reading was taken (unix ns). A span boundary within `probe_reuse_us` of the last reading
# reuses it, and the analyzer must place the values where they were read, not at the later boundary.
MEM_READ_TIME = "vlmtrace.mem.read_time"

# Readings that change over a span and so get a DELTA_SUFFIX key on end.
MEM_DELTA_KEYS = (
    MEM_TORCH_ALLOCATED,
    MEM_TORCH_RESERVED,
    MEM_TORCH_INACTIVE_SPLIT,
    MEM_TORCH_ALLOC_RETRIES,
    MEM_TORCH_OOMS,
    MEM_GPU_PROCESS,
    MEM_GPU_USED,
    MEM_NATIVE,
    MEM_HOST_RSS,
    MEM_HOST_HEAP,
    MEM_READ_TIME,
)
# The reading at the end of prompt processing (0.16+: `AsyncEngine.preprocess` returning), on the request
# span: prompt processing has no span of its own (one span fewer per request), yet the analyzer places
# growth there from this reading and the request's start (docs/analysis.md, "Where").
PROMPT_END_PREFIX = "vlmtrace.request.prompt_end."
PROMPT_END_KEYS = {
    key: PROMPT_END_PREFIX + key.removeprefix("vlmtrace.mem.")
    for key in (
        MEM_TORCH_ALLOCATED,
        MEM_TORCH_RESERVED,
        MEM_GPU_PROCESS,
        MEM_NATIVE,
        MEM_HOST_RSS,
        MEM_HOST_HEAP,
        MEM_READ_TIME,
    )
}
# The reading when the request's last output reached the caller, on the request span: what the request
# does after the response (session cleanup, post-processing) then has a bracket of its own, where the
# engine's steps no longer run (docs/analysis.md, "Where").
RESPONSE_END_PREFIX = "vlmtrace.request.response_end."
RESPONSE_END_KEYS = {key: RESPONSE_END_PREFIX + key.removeprefix("vlmtrace.mem.") for key in PROMPT_END_KEYS}
# Readings that get PER_DEVICE_SUFFIX arrays when more than one device is probed.
MEM_PER_DEVICE_KEYS = (
    MEM_TORCH_ALLOCATED,
    MEM_TORCH_RESERVED,
    MEM_TORCH_INACTIVE_SPLIT,
    MEM_GPU_PROCESS,
    MEM_GPU_USED,
    MEM_GPU_TOTAL,
    MEM_NATIVE,
)


def span_memory_attributes(start: Mapping[str, Any], end: Mapping[str, Any]) -> dict[str, Any]:
    """A span's memory attributes from its readings at start and end: the end values, and
    KEY + DELTA_SUFFIX = end - start for each MEM_DELTA_KEYS key read at both ends. The recorder keeps
    the two readings apart on the request path; the journal reader and the OTLP bridge merge them here."""
    attributes = dict(end)
    for key in MEM_DELTA_KEYS:
        if key in attributes and key in start:
            attributes[key + DELTA_SUFFIX] = attributes[key] - start[key]
    return attributes


# vlmtrace's own cost, in every memory sample: cumulative seconds spent starting and ending spans.
SELF_SECONDS = "vlmtrace.self.seconds"

# Resource attributes.
RESOURCE_VLMTRACE_VERSION = "vlmtrace.version"
RESOURCE_LMDEPLOY_VERSION = "lmdeploy.version"
# True where span boundaries carry host memory read there; without it (older journals, host probe off)
# a span's host reading is the latest background sample's, and the analyzer treats it so.
RESOURCE_HOST_AT_BOUNDARIES = "vlmtrace.mem.host.at_boundaries"
# Where stage detail is sampled (`detail_every` above 1): every request's detail while the process is young
# (its first RESOURCE_DETAIL_YOUNG requests) and while growth is suspected, 1 in RESOURCE_DETAIL_EVERY after.
RESOURCE_DETAIL_EVERY = "vlmtrace.detail.every"
RESOURCE_DETAIL_YOUNG = "vlmtrace.detail.young_requests"
# Whether every request also recorded its detail while growth was suspected (the live suspicion of `capture=auto`).
RESOURCE_DETAIL_WHILE_SUSPECTED = "vlmtrace.detail.while_suspected"

# Spans of the serving layer (the OpenAI-compatible api_server and the PyTorch engine's own process).
SPAN_PYTORCH_STREAM = "lmdeploy.pytorch.stream"  # a request's life in the engine process (api_server, mp engine)
ENGINE_STATUS = "vlmtrace.engine.status"  # on lmdeploy.pytorch.stream: the last output's ResponseType name
STAGE_HTTP_SERVER = "http.server"  # the HTTP request span: named f"{method} {route}", kind SERVER

# The heap counter's large chunks (64 KiB and up) in use, by the stage whose work allocated them, in the
# background sampler's readings of a process started with the counter preloaded (probes/heap.py): a list
# of bytes, one per stage of HEAP_STAGE_TAGS in its order (None: outside vlmtrace's spans). That order is
# the counter's stage numbering (at most 32); new stages go at the end.
MEM_HOST_HEAP_BY_STAGE = "vlmtrace.mem.host.heap.by_stage"
# The same chunks by allocating stage and by when they were allocated, in a sample every few seconds and the
# last: {"origin_ms": unix ms, "width_ms": ms, "bytes": one list per stage of HEAP_STAGE_TAGS, each of
# equal-width intervals from the origin on (an empty list: no chunk of that stage in use)}.
MEM_HOST_HEAP_SURVIVORS = "vlmtrace.mem.host.heap.survivors"
HEAP_STAGE_TAGS = (
    None,
    STAGE_PIPELINE,
    STAGE_REQUEST,
    STAGE_PROMPT,
    STAGE_RESPONSE,
    STAGE_VISION_PREPROCESS,
    STAGE_VISION_INFER,
    STAGE_VISION_FORWARD,
    STAGE_VISION_BATCH,
    STAGE_ENGINE_STREAM,
    STAGE_ENGINE_FORWARD,
    STAGE_EMPTY_CACHE,
    STAGE_CACHE_TRIM,
    STAGE_HEAP_TRIM,
    STAGE_HTTP_SERVER,
)

# The keys of a memory reading in the order journal format 3 writes a reading as an array (the header
# declares them as `mem_keys`; docs/journal.md): the span boundaries' keys first, the sampler's after them.
JOURNAL_MEM_KEYS = (
    MEM_READ_TIME,
    MEM_HOST_RSS,
    MEM_DEVICES,
    MEM_TORCH_ALLOCATED,
    MEM_TORCH_RESERVED,
    MEM_TORCH_INACTIVE_SPLIT,
    MEM_TORCH_ALLOC_RETRIES,
    MEM_TORCH_OOMS,
    MEM_GPU_USED,
    MEM_GPU_TOTAL,
    MEM_GPU_PROCESS,
    MEM_NATIVE,
    MEM_HOST_HEAP,
    SELF_SECONDS,
    LMDEPLOY_TM_ACTIVE_SEQS,
    LMDEPLOY_TM_WAITING_SEQS,
    LMDEPLOY_TM_CACHE_USAGE,
    LMDEPLOY_TM_SCHEDULER_TICK,
    MEM_HOST_HEAP_BY_STAGE,
    MEM_HOST_HEAP_SURVIVORS,
)

# HTTP semantic conventions (the api_server's SERVER span).
HTTP_REQUEST_METHOD = "http.request.method"
HTTP_ROUTE = "http.route"
HTTP_RESPONSE_STATUS_CODE = "http.response.status_code"
URL_PATH = "url.path"
URL_SCHEME = "url.scheme"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
CLIENT_ADDRESS = "client.address"
ERROR_TYPE = "error.type"  # on a span that ended in an error, and on its request's metrics
ERROR_TYPE_OTHER = "_OTHER"  # error.type where no exception names the error (LMDeploy's finish reason "error")


def error_type(error: BaseException) -> str:
    """`error.type` (and `exception.type`) for an exception: its type's fully qualified name, builtins
    unqualified (`ValueError`, `asyncio.exceptions.CancelledError`), as the SDK's `record_exception` writes it."""
    kind = type(error)
    module = kind.__module__
    return f"{module}.{kind.__qualname__}" if module and module != "builtins" else kind.__qualname__


# The GenAI content event (the Logs API), where the capture mode asks for events: the request's GenAI
# attributes with its prompt and response as structured values.
EVENT_INFERENCE_DETAILS = "gen_ai.client.inference.operation.details"

# Metrics (docs/schema.md, "Metrics"). Memory per GPU carries HW_ID; request metrics carry the GenAI
# request attributes (operation, provider, model).
METRIC_GPU_MEMORY_USAGE = "hw.gpu.memory.usage"
METRIC_GPU_MEMORY_LIMIT = "hw.gpu.memory.limit"
METRIC_PROCESS_GPU_MEMORY_USAGE = "process.gpu.memory.usage"
METRIC_TORCH_ALLOCATED = "vlmtrace.memory.torch.allocated"
METRIC_TORCH_RESERVED = "vlmtrace.memory.torch.reserved"
METRIC_TORCH_INACTIVE_SPLIT = "vlmtrace.memory.torch.inactive_split"
METRIC_NATIVE = "vlmtrace.memory.native"
METRIC_PROCESS_MEMORY_USAGE = "process.memory.usage"
METRIC_TIME_TO_FIRST_TOKEN = "gen_ai.server.time_to_first_token"
METRIC_TIME_PER_OUTPUT_TOKEN = "gen_ai.server.time_per_output_token"
METRIC_REQUEST_DURATION = "gen_ai.server.request.duration"
METRIC_REQUESTS = "vlmtrace.requests"
METRIC_IMAGES = "vlmtrace.images"
METRIC_TOKENS = "vlmtrace.tokens"
METRIC_TOKEN_USAGE = "gen_ai.client.token.usage"
METRIC_SELF_TIME = "vlmtrace.self.time"

# Metric attributes.
HW_ID = "hw.id"  # "gpu{NVML index}"
HW_VENDOR = "hw.vendor"  # on hw.gpu.*: "NVIDIA"
HW_MODEL = "hw.model"  # on hw.gpu.*: NVML's device name
HW_NAME = "hw.name"  # on hw.gpu.*: "{model} (gpu{index})"
HW_DRIVER_VERSION = "hw.driver_version"  # on hw.gpu.*: NVML's driver version
GEN_AI_TOKEN_TYPE = "gen_ai.token.type"  # "input" | "output"
REQUEST_FINISH_REASON = "vlmtrace.request.finish_reason"

# The attribute names vlmtrace writes on spans, in the order journal format 3 numbers them (the header
# declares them as `attr_keys`; a record's attribute of a declared name is written as its index): the
# most frequent first, whose indices are shortest.
JOURNAL_ATTR_KEYS = (
    STAGE,
    STEP_KIND,
    STEP_SEQUENCES,
    STEP_TOKENS,
    STEP_KV_TOKENS,
    STEP_SESSION_IDS,
    STEP_KV_BLOCKS,
    STEP_SCHEDULE_SECONDS,
    LMDEPLOY_SESSION_ID,
    VISION_MAX_BATCH_SIZE,
    VISION_IMAGES,
    VISION_PIXELS,
    GEN_AI_USAGE_INPUT_TOKENS,
    VISION_IMAGE_WIDTHS,
    VISION_IMAGE_HEIGHTS,
    GEN_AI_OPERATION_NAME,
    GEN_AI_PROVIDER_NAME,
    GEN_AI_REQUEST_MODEL,
    LMDEPLOY_BACKEND,
    REQUEST_IMAGES,
    REQUEST_IMAGE_PIXELS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    GEN_AI_REQUEST_MAX_TOKENS,
    GEN_AI_REQUEST_TEMPERATURE,
    GEN_AI_REQUEST_TOP_P,
    GEN_AI_REQUEST_TOP_K,
    VISION_TOKENS,
    *JOURNAL_MEM_KEYS,
    REQUEST_OUTPUT_CHUNKS,
    REQUEST_TTFT,
    GEN_AI_RESPONSE_FINISH_REASONS,
    REQUEST_PREPROCESS_DURATION,
    PIPELINE_PROMPTS,
    PIPELINE_IMAGES,
    VISION_MODULE,
    VISION_INPUT_SHAPE,
    ENGINE_OUTPUT_CHUNKS,
    *PROMPT_END_KEYS.values(),
    GEN_AI_REQUEST_STREAM,
    GEN_AI_RESPONSE_MODEL,
    *(key + DELTA_SUFFIX for key in MEM_DELTA_KEYS),
    *RESPONSE_END_KEYS.values(),
    STEP_COUNT,
    ENGINE_STATUS,
    GEN_AI_REQUEST_SEED,
    GEN_AI_REQUEST_STOP_SEQUENCES,
    GEN_AI_INPUT_MESSAGES,
    GEN_AI_OUTPUT_MESSAGES,
    THREAD_NAME,
    *(key + PER_DEVICE_SUFFIX for key in MEM_PER_DEVICE_KEYS),
    CACHE_TRIM_BOUND,
    CACHE_TRIM_LIMIT,
    CACHE_TRIM_DEVICE,
    CACHE_TRIM_CACHED,
    CACHE_TRIM_FREE,
    CACHE_TRIM_TRIGGER_TIME,
    CACHE_TRIM_RELEASED,
    HTTP_REQUEST_METHOD,
    HTTP_ROUTE,
    HTTP_RESPONSE_STATUS_CODE,
    URL_PATH,
    URL_SCHEME,
    SERVER_ADDRESS,
    SERVER_PORT,
    CLIENT_ADDRESS,
    ERROR_TYPE,
    REQUEST_DETAIL_SKIPPED,
)
