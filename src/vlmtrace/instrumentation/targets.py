"""Where LMDeploy keeps what vlmtrace wraps, per release family.

LMDeploy moves its internals between releases (0.4–0.6 had `serve.async_engine.AsyncEngine` and
`VisonConfig`; 0.16+ has `serve.core.async_engine` and `pipeline.Pipeline`). A family is chosen
from the installed version; each target is wrapped when its module is imported, and one that is
missing is reported (`vlmtrace doctor`, and a warning) instead of failing.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import re

# Roles: what a target does for the trace; `instrumentor.WRAPPERS` builds one wrapper per role.
PIPELINE_INFER = "pipeline.infer"
PIPELINE_STREAM_INFER = "pipeline.stream_infer"
PIPELINE_CHAT = "pipeline.chat"
PIPELINE_HANDOFF = "pipeline.handoff"
REQUEST_PREPROCESS = "request.preprocess"
REQUEST_GENERATE = "request.generate"
VISION_PREPROCESS = "vision.preprocess"
VISION_INFER = "vision.infer"
TURBOMIND_STREAM = "turbomind.stream"
PYTORCH_SCHEDULE = "pytorch.schedule"
PYTORCH_DISPATCH = "pytorch.dispatch"
PYTORCH_DRAIN = "pytorch.drain"
PYTORCH_FORWARD = "pytorch.forward"
TORCH_EMPTY_CACHE = "torch.empty_cache"


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
    first: tuple[int, ...]  # the oldest release it covers
    targets: tuple[Target, ...]


_TORCH = (Target(TORCH_EMPTY_CACHE, "torch.cuda", "empty_cache", required=False),)

FAMILY_0_16 = Family("0.16+", (0, 16), (
    Target(PIPELINE_INFER, "lmdeploy.pipeline", "Pipeline.infer"),
    Target(PIPELINE_STREAM_INFER, "lmdeploy.pipeline", "Pipeline.stream_infer"),
    Target(PIPELINE_CHAT, "lmdeploy.pipeline", "Pipeline.chat"),
    Target(PIPELINE_HANDOFF, "lmdeploy.pipeline", "Pipeline._infer"),
    Target(REQUEST_PREPROCESS, "lmdeploy.serve.core.async_engine", "AsyncEngine.preprocess"),
    Target(REQUEST_GENERATE, "lmdeploy.serve.core.async_engine", "AsyncEngine.generate"),
    Target(VISION_PREPROCESS, "lmdeploy.vl.engine", "ImageEncoder.preprocess"),
    Target(VISION_INFER, "lmdeploy.vl.engine", "ImageEncoder.async_infer"),
    Target(TURBOMIND_STREAM, "lmdeploy.turbomind.turbomind", "TurboMindInstance.async_stream_infer"),
    Target(PYTORCH_SCHEDULE, "lmdeploy.pytorch.engine.inputs_maker", "InputsMakerAsync._send_next_inputs_impl"),
    Target(PYTORCH_DISPATCH, "lmdeploy.pytorch.engine.model_agent.agent", "BaseModelAgent.set_forward_inputs"),
    Target(PYTORCH_DRAIN, "lmdeploy.pytorch.engine.model_agent.agent", "BaseModelAgent._drain_queues",
           required=False),
    Target(PYTORCH_FORWARD, "lmdeploy.pytorch.engine.model_agent.agent", "BaseModelAgent._async_step"),
) + _TORCH)

FAMILIES = (FAMILY_0_16,)


def parse_version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def installed_lmdeploy_version() -> str | None:
    try:
        return importlib.metadata.version("lmdeploy")
    except importlib.metadata.PackageNotFoundError:
        return None


def family_for(version: str | None) -> Family:
    """The newest family whose first release is not after `version` (the newest if unknown)."""
    if version is None:
        return FAMILIES[-1]
    parsed = parse_version(version)
    eligible = [family for family in FAMILIES if family.first <= parsed]
    return max(eligible, key=lambda family: family.first) if eligible else FAMILIES[0]


def resolve_attribute(module, qualname: str):
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
    except Exception as error:
        return f"missing: import failed ({type(error).__name__}: {error})"
    try:
        resolve_attribute(module, target.qualname)
    except AttributeError as error:
        return f"missing: {error}"
    return "found"
