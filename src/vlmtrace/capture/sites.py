"""Allocation sites: the surviving allocations of a capture window grouped by the line that made them.

A stack is a list of `Frame`s, innermost first. Its site is the innermost frame outside the capturing
machinery (vlmtrace itself, tracemalloc, torch's own Python), its function named from the source file
(tracemalloc keeps file and line only). Its stage is the stage whose wrapped LMDeploy function the
stack passes through, innermost first (`stage_of`): an allocation made while that stage's span was
current, on the thread that runs its work. Work a stage hands to another thread (an executor job)
carries no stage in its stack; its sites have none.

Sites are grouped by their frame and short stack, largest first; a record keeps at most MAX_SITES of
them with at most STACK_FRAMES frames each, and says what it left out.
"""

from __future__ import annotations

import dataclasses
import functools
import linecache
import os
import re
import sys
import tracemalloc
from collections.abc import Iterable

from vlmtrace import semconv as sc
from vlmtrace.instrumentation import targets

MAX_SITES = 20
STACK_FRAMES = 6
TEXT_CHARS = 300
MAX_SOURCE_BYTES = 4 * 1024 * 1024  # a larger "source file" is not parsed for function names
_VLMTRACE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_INSTRUMENTATION = os.path.join(_VLMTRACE, "instrumentation") + os.sep
_TRACEMALLOC = os.path.dirname(os.path.abspath(tracemalloc.__file__ or "tracemalloc.py"))
# The stage of each wrapped LMDeploy function, by its target's role; and, for a callable put in a target's
# place (a patch), the roles each of vlmtrace's wrapper modules wraps.
ROLE_STAGES = {
    targets.PIPELINE_INFER: sc.STAGE_PIPELINE,
    targets.PIPELINE_STREAM_INFER: sc.STAGE_PIPELINE,
    targets.PIPELINE_CHAT: sc.STAGE_PIPELINE,
    targets.REQUEST_PREPROCESS: sc.STAGE_PROMPT,
    targets.REQUEST_PROMPT_INPUT: sc.STAGE_PROMPT,
    targets.REQUEST_GENERATE: sc.STAGE_REQUEST,
    targets.REQUEST_FROM_MESSAGES: sc.STAGE_REQUEST,
    targets.VISION_PREPROCESS: sc.STAGE_VISION_PREPROCESS,
    targets.VISION_INFER: sc.STAGE_VISION_INFER,
    targets.VISION_ENCODE_IMAGES: sc.STAGE_VISION_INFER,
    targets.VISION_BATCH: sc.STAGE_VISION_BATCH,
    targets.TURBOMIND_STREAM: sc.STAGE_ENGINE_STREAM,
    targets.PYTORCH_FORWARD: sc.STAGE_ENGINE_FORWARD,
    targets.PYTORCH_MODEL_FORWARD: sc.STAGE_ENGINE_FORWARD,
}
WRAPPER_ROLES = {
    "pipeline.py": "pipeline.",
    "request.py": "request.",
    "vision.py": "vision.",
    "turbomind.py": "turbomind.",
    "pytorch_engine.py": "pytorch.",
}


@dataclasses.dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str | None = None  # as the capture gave it (torch does, tracemalloc does not)

    def named(self) -> str:
        """`Class.method` from the source where it can be read, else the capture's function name."""
        return function_at(self.file, self.line) or self.function or "?"

    def text(self) -> str:
        """`file:line`, with the function where the capture gave it (reading sources for the rest of a stack
        would cost the sampler's thread a parse of every file it passes through)."""
        return _short(f"{self.file}:{self.line} in {self.function}" if self.function else f"{self.file}:{self.line}")


def _short(text: str) -> str:
    return text if len(text) <= TEXT_CHARS else "…" + text[-(TEXT_CHARS - 1) :]


_BLOCK = re.compile(r"(?:async\s+def|def|class)\s+(\w+)")


@functools.lru_cache(maxsize=512)
def _source(file: str) -> tuple[str, ...]:
    """A source file's lines; none where it cannot be read or is too large to be a source file."""
    try:
        if os.path.getsize(file) > MAX_SOURCE_BYTES:
            return ()
    except OSError:
        return ()
    return tuple(linecache.getlines(file))


def function_at(file: str, line: int) -> str | None:
    """The qualified name of the function holding `line` of `file` (`Class.method`; a nested function's
    enclosing names joined by dots), from the indentation of the lines above it: a few string operations
    where parsing the file would hold the sampler's thread for milliseconds. None outside a function."""
    lines = _source(file)
    if not 0 < line <= len(lines):
        return None
    names: list[str] = []
    kinds: list[str] = []
    text = lines[line - 1]
    indent = len(text) - len(text.lstrip()) if text.strip() else 1 << 30
    for text in reversed(lines[: line - 1]):
        stripped = text.lstrip()
        if not stripped or stripped.startswith(("#", ")", "]", "}")):
            continue
        level = len(text) - len(stripped)
        if level >= indent:
            continue
        indent = level
        found = _BLOCK.match(stripped)
        if found:
            names.append(found.group(1))
            kinds.append(stripped.split(None, 1)[0])
        if level == 0:
            break
    if not names or kinds[0] == "class":
        return None
    return ".".join(reversed(names))


def machinery(frame: Frame) -> bool:
    """A frame of the capture itself or of vlmtrace's wrappers, never a site."""
    return _machinery_file(frame.file)


@functools.lru_cache(maxsize=4096)
def _machinery_file(file: str) -> bool:
    file = os.path.abspath(file) if file[:1] not in ("<", "") else file
    return file.startswith((_VLMTRACE, _TRACEMALLOC)) or "/torch/" in file.replace("\\", "/")


def _target_functions(family_targets: Iterable[targets.Target]) -> tuple[dict, dict]:
    """(file, qualname) of each imported target: its stage; and per wrapper module, method name: stage."""
    exact: dict[tuple[str, str], str] = {}
    by_wrapper: dict[tuple[str, str], str] = {}
    for target in family_targets:
        stage = ROLE_STAGES.get(target.role)
        if stage is None:
            continue
        module = sys.modules.get(target.module)
        file = getattr(module, "__file__", None)
        if file:
            exact.setdefault((os.path.abspath(file), target.qualname), stage)
        for wrapper, prefix in WRAPPER_ROLES.items():
            if target.role.startswith(prefix):
                by_wrapper.setdefault((wrapper, target.qualname.rsplit(".", 1)[-1]), stage)
    return exact, by_wrapper


class StageMap:
    """Which stage a stack's allocation belongs to, from the family's wrapped functions."""

    def __init__(self, family_targets: Iterable[targets.Target]) -> None:
        self._exact, self._by_wrapper = _target_functions(family_targets)
        self._target_files = {file for file, _ in self._exact}

    def stage_of(self, stack: list[Frame]) -> str | None:
        """The innermost frame that is a wrapped function (the target itself, or whatever callable one of
        vlmtrace's wrappers called in its place) names the stage. Only those frames' functions are named
        (a source file parsed): frames in a target's module, and frames called by a wrapper."""
        for index, frame in enumerate(stack):
            file = os.path.abspath(frame.file)
            if file in self._target_files:
                stage = self._exact.get((file, frame.named()))
                if stage is not None:
                    return stage
            caller = stack[index + 1] if index + 1 < len(stack) else None
            if caller is not None and os.path.abspath(caller.file).startswith(_INSTRUMENTATION):
                stage = self._by_wrapper.get((os.path.basename(caller.file), frame.named().rsplit(".", 1)[-1]))
                if stage is not None:
                    return stage
        return None


@dataclasses.dataclass
class Site:
    frame: Frame
    stack: tuple[Frame, ...]
    stage: str | None
    count: int = 0
    bytes: int = 0


def group(allocations: Iterable[tuple[list[Frame], int, int]], stages: StageMap) -> list[Site]:
    """(stack innermost first, bytes, count) of each surviving allocation, as sites, largest first. Only the
    MAX_SITES largest are given a stage (reading source files for function names costs)."""
    groups: dict[tuple[Frame, ...], list] = {}  # short stack: [a full stack, count, bytes]
    for stack, size, count in allocations:
        if size <= 0:
            continue
        own = [frame for frame in stack if not machinery(frame)]
        if not own:
            continue
        key = tuple(own[:STACK_FRAMES])
        entry = groups.get(key)
        if entry is None:
            entry = groups[key] = [stack, 0, 0]
        entry[1] += count
        entry[2] += size
    ordered = sorted(groups.items(), key=lambda item: -item[1][2])
    return [
        Site(key[0], key, stages.stage_of(stack) if index < MAX_SITES else None, count, size)
        for index, (key, (stack, count, size)) in enumerate(ordered)
    ]


def as_record(sites: list[Site], requests: int) -> dict:
    """The capture record's `sites`, `sites_left_out`, `bytes_left_out`: at most MAX_SITES sites."""
    kept, rest = sites[:MAX_SITES], sites[MAX_SITES:]
    return {
        "sites": [
            {
                "file": _short(site.frame.file),
                "line": site.frame.line,
                "function": _short(site.frame.named()),
                "stage": site.stage,
                "stack": [frame.text() for frame in site.stack],
                "count": site.count,
                "bytes": site.bytes,
                "bytes_per_request": site.bytes / requests if requests else None,
            }
            for site in kept
        ],
        "sites_left_out": len(rest),
        "bytes_left_out": sum(site.bytes for site in rest),
    }
