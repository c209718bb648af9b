"""Where LMDeploy keeps what vlmtrace wraps, per release family.

LMDeploy moves its internals between releases: 0.4–0.6.4 have no `Pipeline` class (the pipeline is
`serve.async_engine.AsyncEngine` itself, `generate(messages, …)` is a whole request, prompt
processing included, and `ImageEncoder` batches PIL images itself); 0.12–0.15 have
`pipeline.Pipeline` and `serve.core`, but `generate` still processes the prompt (through
`MultimodalProcessor`); 0.16+ splits `preprocess` from `generate`. Each target is wrapped when its
module is imported, and one that is missing is reported (`vlmtrace doctor`, and a warning) instead
of failing. Which family applies: `selection.py`; every table, and what CI runs: docs/versions.md.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import re
from typing import Any

# Roles: what a target does for the trace; `instrumentor._wrappers()` builds one wrapper per role.
PIPELINE_INFER = "pipeline.infer"
PIPELINE_STREAM_INFER = "pipeline.stream_infer"
PIPELINE_CHAT = "pipeline.chat"
PIPELINE_HANDOFF = "pipeline.handoff"
REQUEST_PREPROCESS = "request.preprocess"
REQUEST_GENERATE = "request.generate"
REQUEST_FROM_MESSAGES = "request.from_messages"  # generate(messages, …): the whole request
REQUEST_PROMPT_INPUT = "request.prompt_input"  # prompt rendering and images inside such a request
VISION_PREPROCESS = "vision.preprocess"
VISION_INFER = "vision.infer"
VISION_ENCODE_IMAGES = "vision.encode_images"  # one request's images (0.4–0.6.4: PIL images, batched later)
VISION_BATCH = "vision.batch"  # the encoder's forward over a batch of images from any requests
TURBOMIND_STREAM = "turbomind.stream"
PYTORCH_SCHEDULE = "pytorch.schedule"
PYTORCH_DISPATCH = "pytorch.dispatch"
PYTORCH_DRAIN = "pytorch.drain"
PYTORCH_FORWARD = "pytorch.forward"
PYTORCH_MODEL_FORWARD = "pytorch.model_forward"  # 0.4–0.6.4: `Engine._async_model_forward`, one per step
TORCH_EMPTY_CACHE = "torch.empty_cache"
PYTORCH_HEAP_TRIM = "pytorch.heap_trim"  # the engine's own gc.collect() + malloc_trim(0), every 128 multimodal sessions
SERVER_APP = "server.app"
PYTORCH_MP_SEND = "pytorch.mp_send"
PYTORCH_MP_RECEIVE = "pytorch.mp_receive"


@dataclasses.dataclass(frozen=True)
class Target:
    role: str
    module: str
    qualname: str  # "Class.method" or "function"
    required: bool = True  # False: a refinement whose absence costs detail, not correctness

    @property
    def name(self) -> str:
        return f"{self.module}.{self.qualname}"


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    first: tuple[int, ...]  # the oldest release it covers: (0, 12) is every 0.12.x
    last: tuple[int, ...] | None  # the newest: (0, 6, 4) stops at 0.6.4; None: every later release
    targets: tuple[Target, ...]

    def covers(self, version: tuple[int, ...]) -> bool:
        return version[: len(self.first)] >= self.first and (
            self.last is None or version[: len(self.last)] <= self.last
        )


_TORCH = (Target(TORCH_EMPTY_CACHE, "torch.cuda", "empty_cache", required=False),)

FAMILY_0_4 = Family(
    "0.4–0.6.4",
    (0, 4),
    (0, 6, 4),
    (
        Target(PIPELINE_INFER, "lmdeploy.serve.async_engine", "AsyncEngine.__call__"),
        Target(PIPELINE_INFER, "lmdeploy.serve.async_engine", "AsyncEngine.batch_infer"),
        Target(PIPELINE_STREAM_INFER, "lmdeploy.serve.async_engine", "AsyncEngine.stream_infer"),
        Target(PIPELINE_CHAT, "lmdeploy.serve.async_engine", "AsyncEngine.chat"),
        Target(REQUEST_FROM_MESSAGES, "lmdeploy.serve.async_engine", "AsyncEngine.generate"),
        Target(REQUEST_PROMPT_INPUT, "lmdeploy.serve.async_engine", "AsyncEngine._get_prompt_input"),
        Target(REQUEST_PROMPT_INPUT, "lmdeploy.serve.vl_async_engine", "VLAsyncEngine._get_prompt_input"),
        Target(VISION_ENCODE_IMAGES, "lmdeploy.vl.engine", "ImageEncoder.async_infer"),
        Target(VISION_BATCH, "lmdeploy.vl.engine", "ImageEncoder.forward"),
        Target(TURBOMIND_STREAM, "lmdeploy.turbomind.turbomind", "TurboMindInstance.async_stream_infer"),
        Target(PYTORCH_MODEL_FORWARD, "lmdeploy.pytorch.engine.engine", "Engine._async_model_forward"),
        *_TORCH,
    ),
)

_PIPELINE = (
    Target(PIPELINE_INFER, "lmdeploy.pipeline", "Pipeline.infer"),
    Target(PIPELINE_STREAM_INFER, "lmdeploy.pipeline", "Pipeline.stream_infer"),
    Target(PIPELINE_CHAT, "lmdeploy.pipeline", "Pipeline.chat"),
    Target(PIPELINE_HANDOFF, "lmdeploy.pipeline", "Pipeline._infer"),
)

_VISION_AND_ENGINES = (
    Target(VISION_PREPROCESS, "lmdeploy.vl.engine", "ImageEncoder.preprocess"),
    Target(VISION_INFER, "lmdeploy.vl.engine", "ImageEncoder.async_infer"),
    Target(TURBOMIND_STREAM, "lmdeploy.turbomind.turbomind", "TurboMindInstance.async_stream_infer"),
    Target(PYTORCH_SCHEDULE, "lmdeploy.pytorch.engine.inputs_maker", "InputsMakerAsync._send_next_inputs_impl"),
    Target(PYTORCH_DISPATCH, "lmdeploy.pytorch.engine.model_agent.agent", "BaseModelAgent.set_forward_inputs"),
    Target(PYTORCH_DRAIN, "lmdeploy.pytorch.engine.model_agent.agent", "BaseModelAgent._drain_queues", required=False),
    Target(PYTORCH_FORWARD, "lmdeploy.pytorch.engine.model_agent.agent", "BaseModelAgent._async_step"),
    Target(PYTORCH_HEAP_TRIM, "lmdeploy.pytorch.engine.engine", "Engine._try_mem_trim", required=False),  # 0.14+
)

FAMILY_0_12 = Family(
    "0.12–0.15",
    (0, 12),
    (0, 15),
    (
        *_PIPELINE,
        Target(REQUEST_FROM_MESSAGES, "lmdeploy.serve.core.async_engine", "AsyncEngine.generate"),
        Target(REQUEST_PROMPT_INPUT, "lmdeploy.serve.processors.multimodal", "MultimodalProcessor.get_prompt_input"),
        *_VISION_AND_ENGINES,
        *_TORCH,
    ),
)

FAMILY_0_16 = Family(
    "0.16+",
    (0, 16),
    None,
    (
        *_PIPELINE,
        Target(REQUEST_PREPROCESS, "lmdeploy.serve.core.async_engine", "AsyncEngine.preprocess"),
        Target(REQUEST_GENERATE, "lmdeploy.serve.core.async_engine", "AsyncEngine.generate"),
        *_VISION_AND_ENGINES,
        Target(SERVER_APP, "lmdeploy.serve.openai.api_server", "mount_metrics", required=False),
        Target(
            PYTORCH_MP_SEND,
            "lmdeploy.pytorch.engine.mp_engine.base",
            "MPEngineInstance.async_stream_infer",
            required=False,
        ),
        Target(
            PYTORCH_MP_RECEIVE,
            "lmdeploy.pytorch.engine.mp_engine.base_worker",
            "EngineWorkerBase.instance_async_stream_infer",
            required=False,
        ),
        *_TORCH,
    ),
)

FAMILIES = (FAMILY_0_4, FAMILY_0_12, FAMILY_0_16)


def parse_version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def installed_lmdeploy_version() -> str | None:
    try:
        return importlib.metadata.version("lmdeploy")
    except importlib.metadata.PackageNotFoundError:
        return None


def resolve_attribute(module: Any, qualname: str) -> tuple[Any, str]:
    """(owner, attribute name) for "Class.method" inside an imported module."""
    owner = module
    *path, attribute = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    if not hasattr(owner, attribute):
        raise AttributeError(f"{owner!r} has no attribute {attribute!r}")
    return owner, attribute


def probe_target(target: Target) -> str:
    """Import the target's module and look it up: "found", or why not (for `vlmtrace doctor`)."""
    try:
        module = importlib.import_module(target.module)
    except Exception as error:  # noqa: BLE001 - doctor reports whatever the import raised
        return f"missing: import failed ({type(error).__name__}: {error})"
    try:
        resolve_attribute(module, target.qualname)
    except AttributeError as error:
        return f"missing: {error}"
    return "found"
