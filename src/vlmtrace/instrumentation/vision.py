"""The vision-encoder layer: `ImageEncoder` calls, and the torch ViT module where one exists.

`ImageEncoder` runs model code in a one-worker ThreadPoolExecutor through `run_in_executor`, which
does not carry contextvars; each encoder's executor is wrapped once so that work submitted to it
runs in the submitting context, and spans opened there have the right parent. The original
executor is put back on uninstrument.

Up to 0.6.4 the encoder batches itself: `async_infer(images)` queues one request's PIL images and
waits, a loop of the encoder's own collects images from any requests into batches of
`max_batch_size` and runs `forward(images)` on each, synchronously, on another thread. Such a batch
serves several requests at once, so (like a PyTorch-engine step) it is a trace of its own, linked
to the `lmdeploy.vision.infer` spans of the requests whose images it holds; the torch ViT runs
inside `forward`, so its spans are the batch's children.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import logging
import threading
import weakref
from collections.abc import Mapping
from typing import Any

from opentelemetry.context import Context

from vlmtrace import semconv as sc
from vlmtrace.export.journal.records import Later
from vlmtrace.instrumentation.inputs import MAX_LISTED_ITEMS, argument, image_facts, image_sizes
from vlmtrace.instrumentation.runtime import BoundedRegistry, SpanHandle, Telemetry, Wrapper, safe, warn_once
from vlmtrace.probes.heap import StageTags

_log = logging.getLogger(__name__)

VIT_MODULE_NAMES = ("visual", "vision_model", "vision_tower", "vpm", "vit")


class ContextCarryingExecutor(concurrent.futures.Executor):
    """Runs each job in a copy of the submitter's context; everything else goes to the original.
    `heap_tags`: the heap counter's stage charges (None: not preloaded), told the job's stage where it runs."""

    def __init__(self, inner: concurrent.futures.Executor, heap_tags: StageTags | None = None) -> None:
        self.inner = inner
        self._heap_tags = heap_tags

    def submit(self, fn, /, *args, **kwargs):
        job = self._heap_tags.submitted(fn) if self._heap_tags is not None else fn
        return self.inner.submit(contextvars.copy_context().run, job, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.inner.shutdown(wait=wait, cancel_futures=cancel_futures)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class ExecutorPatches:
    """The encoders whose executor we wrapped, so uninstrument can restore each one."""

    def __init__(self, heap_tags: StageTags | None = None) -> None:
        self._encoders: weakref.WeakSet = weakref.WeakSet()
        self._heap_tags = heap_tags

    def ensure(self, encoder: Any) -> None:
        executor = getattr(encoder, "executor", None)
        if isinstance(executor, concurrent.futures.Executor) and not isinstance(executor, ContextCarryingExecutor):
            encoder.executor = ContextCarryingExecutor(executor, self._heap_tags)
            self._encoders.add(encoder)

    def restore(self) -> None:
        for encoder in list(self._encoders):
            executor = getattr(encoder, "executor", None)
            if isinstance(executor, ContextCarryingExecutor):
                encoder.executor = executor.inner
        self._encoders = weakref.WeakSet()


def _max_batch_size(encoder: Any) -> dict[str, Any]:
    size = getattr(encoder, "max_batch_size", None)
    if size is None:
        size = getattr(getattr(encoder, "vision_config", None), "max_batch_size", None)
    return {sc.VISION_MAX_BATCH_SIZE: int(size)} if isinstance(size, int) else {}


def _size_attributes(images: list[Any]) -> dict[str, Any]:
    return _sizes_as_attributes(image_sizes(images))


def _sizes_as_attributes(sizes: list[tuple[int, int]]) -> dict[str, Any]:
    if not sizes:
        return {}
    return {
        sc.VISION_IMAGE_WIDTHS: [w for w, _ in sizes[:MAX_LISTED_ITEMS]],
        sc.VISION_IMAGE_HEIGHTS: [h for _, h in sizes[:MAX_LISTED_ITEMS]],
        sc.VISION_PIXELS: sum(w * h for w, h in sizes),
    }


def _image_attributes(encoder: Any, messages: Any) -> dict[str, Any]:
    attributes = _max_batch_size(encoder)
    images, sizes = image_facts(messages)
    attributes[sc.VISION_IMAGES] = images
    attributes.update(_sizes_as_attributes(sizes))
    return attributes


def _image_list_attributes(encoder: Any, images: list[Any]) -> dict[str, Any]:
    """A list of PIL images; anything else (a release that passes messages here) reads as nothing."""
    attributes = _max_batch_size(encoder)
    sizes = _size_attributes(images)
    if sizes:
        attributes[sc.VISION_IMAGES] = len(images)
        attributes.update(sizes)
    return attributes


def _preprocessed_items(messages: Any) -> list[Mapping]:
    """The per-image results (dicts, or transformers' BatchFeature) that LMDeploy's preprocess adds
    under a message with role `preprocess`."""
    items: list[Mapping] = []
    for message in messages if isinstance(messages, list) else []:
        if (
            isinstance(message, dict)
            and message.get("role") == "preprocess"
            and isinstance(message.get("content"), list)
        ):
            items.extend(item for item in message["content"] if isinstance(item, Mapping))
    return items


def _vision_tokens(outputs: Any) -> dict[str, Any]:
    """The images' token counts as LMDeploy's preprocess left them (tensors of a few ints): taken now, summed
    off the request path (`Later`), where the record is encoded."""
    counts = [
        count for count in (item.get("image_tokens") for item in _preprocessed_items(outputs)) if count is not None
    ]
    return {sc.VISION_TOKENS: Later(_token_sum, counts)} if counts else {}


def _token_sum(counts: list[Any]) -> int:
    return sum(sum(count.tolist()) if hasattr(count, "tolist") else int(count) for count in counts)


def _preprocessed_attributes(encoder: Any, messages: Any) -> dict[str, Any]:
    attributes = _max_batch_size(encoder)
    items = _preprocessed_items(messages)
    attributes[sc.VISION_IMAGES] = len(items)
    sizes = [item["image_size"] for item in items if isinstance(item.get("image_size"), tuple)]
    if sizes:
        attributes[sc.VISION_PIXELS] = sum(int(w) * int(h) for w, h in sizes)
    return attributes


def encoder_call(
    telemetry: Telemetry, patches: ExecutorPatches, span_name: str, stage: str, reads_raw_images: bool
) -> Wrapper:
    """An async `ImageEncoder` method; `reads_raw_images`: its messages still hold the images, not
    the preprocessed tensors."""

    async def wrapper(wrapped, instance, args, kwargs):
        patches.ensure(instance)
        if telemetry.detail_skipped():
            return await wrapped(*args, **kwargs)
        messages = argument(args, kwargs, 0, "messages")
        extract = _image_attributes if reads_raw_images else _preprocessed_attributes
        with telemetry.start(span_name, stage, safe(extract, instance, messages)).active() as handle:
            outputs = await wrapped(*args, **kwargs)
            if reads_raw_images:
                handle.set_attributes(safe(_vision_tokens, outputs))
        return outputs

    return wrapper


class QueuedImages:
    """Images waiting in an encoder's queue, by identity, with the `vision.infer` span that queued
    them: the batch that takes them links to it."""

    MAX_QUEUED = 4096

    def __init__(self) -> None:
        self._waiting = BoundedRegistry(self.MAX_QUEUED)

    def add(self, images: list[Any], handle: SpanHandle) -> None:
        for image in images:
            self._waiting.put(id(image), (image, handle.span_context))

    def remove(self, images: list[Any]) -> None:
        for image in images:
            entry = self._waiting.get(id(image))
            if entry is not None and entry[0] is image:
                self._waiting.pop(id(image))

    def requesters(self, images: list[Any]) -> list[Any]:
        """The distinct span contexts that queued these images, in batch order."""
        found: dict[int, Any] = {}
        for image in images:
            entry = self._waiting.get(id(image))
            if entry is not None and entry[0] is image:
                found.setdefault(entry[1].span_id, entry[1])
        return list(found.values())


def queue_images(telemetry: Telemetry, queued: QueuedImages) -> Wrapper:
    """`ImageEncoder.async_infer(images, params=None)` (0.4–0.6.4): one request's images, from
    queueing to their features coming back."""

    async def wrapper(wrapped, instance, args, kwargs):
        if telemetry.detail_skipped():
            return await wrapped(*args, **kwargs)
        images = argument(args, kwargs, 0, "inputs")
        images = list(images) if isinstance(images, (list, tuple)) else []
        attributes = safe(_image_list_attributes, instance, images)
        handle = telemetry.start(sc.SPAN_VISION_INFER, sc.STAGE_VISION_INFER, attributes)
        queued.add(images, handle)
        with handle.active(finish=lambda: queued.remove(images)):
            outputs = await wrapped(*args, **kwargs)
        _fill_request_pixels(telemetry, attributes)
        return outputs

    return wrapper


def _fill_request_pixels(telemetry: Telemetry, attributes: Mapping[str, Any]) -> None:
    """0.4 hands the pipeline's images to `generate` as base64 data URLs, whose sizes the request
    layer does not decode: the request takes its pixels from its encoder call instead."""
    request = telemetry.request_in_context()
    if request is not None and sc.VISION_PIXELS in attributes:
        request.handle.span.attributes.setdefault(sc.REQUEST_IMAGE_PIXELS, attributes[sc.VISION_PIXELS])


def encoder_batch(telemetry: Telemetry, queued: QueuedImages, hooks: VitHooks) -> Wrapper:
    """`ImageEncoder.forward(images, params=None)` (0.4–0.6.4): the vision model over one batch."""

    def wrapper(wrapped, instance, args, kwargs):
        hooks.attach_once(instance, "model")
        images = argument(args, kwargs, 0, "inputs")
        images = list(images) if isinstance(images, (list, tuple)) else []
        with telemetry.start(
            sc.SPAN_VISION_BATCH,
            sc.STAGE_VISION_BATCH,
            safe(_image_list_attributes, instance, images),
            context=Context(),
            links=queued.requesters(images),
        ).active():
            return wrapped(*args, **kwargs)

    return wrapper


def _first_tensor_shape(args: tuple, kwargs: dict) -> list[int] | None:
    for value in list(args) + list(kwargs.values()):
        shape = getattr(value, "shape", None)
        if shape is not None:
            return [int(d) for d in shape]
    return None


class VitHooks:
    """Forward hooks on a torch ViT module: one `lmdeploy.vision.forward` span per call."""

    def __init__(self, telemetry: Telemetry) -> None:
        self._telemetry = telemetry
        self._removables: list[Any] = []
        self._open = threading.local()
        self._hooked: weakref.WeakSet = weakref.WeakSet()
        self._owners: weakref.WeakSet = weakref.WeakSet()
        self._last_owner: weakref.ref | None = None

    def attach_once(self, owner: Any, model_attribute: str) -> None:
        """Hook the ViT of `owner.<model_attribute>` the first time this owner is seen (asked at every
        PyTorch-engine step: the owner seen last is checked first, without a WeakSet lookup)."""
        last = self._last_owner
        if last is not None and last() is owner:
            return
        self._last_owner = weakref.ref(owner)
        if owner in self._owners:
            return
        self._owners.add(owner)
        try:
            self.attach_to_model(getattr(owner, model_attribute, None))
        except Exception as error:  # noqa: BLE001 - the engine runs on without vision.forward spans
            warn_once(
                "vit-hook",
                "could not hook the ViT module (%s: %s); vision.forward spans are off",
                type(error).__name__,
                error,
                logger=_log,
            )

    def attach_to_model(self, model: Any) -> None:
        module = find_vit_module(model)
        if module is None or module in self._hooked:
            return
        self._hooked.add(module)
        self._removables.append(module.register_forward_pre_hook(self._before, with_kwargs=True))
        self._removables.append(module.register_forward_hook(self._after, always_call=True))

    def _stack(self) -> list[SpanHandle]:
        stack = getattr(self._open, "stack", None)
        if stack is None:
            stack = self._open.stack = []
        return stack

    def _before(self, module, args, kwargs):
        attributes: dict[str, Any] = {sc.VISION_MODULE: type(module).__name__}
        shape = _first_tensor_shape(args, kwargs)
        if shape:
            attributes[sc.VISION_INPUT_SHAPE] = shape
        self._stack().append(self._telemetry.start(sc.SPAN_VISION_FORWARD, sc.STAGE_VISION_FORWARD, attributes))

    def _after(self, module, args, output):
        stack = self._stack()
        if stack:
            stack.pop().end()

    def remove(self) -> None:
        for removable in self._removables:
            removable.remove()
        self._removables.clear()
        self._hooked = weakref.WeakSet()
        self._owners = weakref.WeakSet()
        self._last_owner = None


def find_vit_module(model: Any) -> Any:
    """The vision tower inside an LMDeploy model, by the attribute names VLMs use for it."""
    seen = set()
    pending = [model]
    while pending:
        current = pending.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        for name in VIT_MODULE_NAMES:
            candidate = getattr(current, name, None)
            if candidate is not None and hasattr(candidate, "register_forward_hook"):
                return candidate
        pending.extend(
            getattr(current, attribute, None) for attribute in ("model", "language_model", "patched_model", "_model")
        )
    return None
