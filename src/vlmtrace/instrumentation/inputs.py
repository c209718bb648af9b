"""Facts about a call's inputs (prompts, images, sessions), read without touching pixel data."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vlmtrace import compiled

MAX_LISTED_ITEMS = 64
IMAGE_CONTENT_TYPES = ("image", "image_url", "image_data")


def argument(args: tuple, kwargs: dict, index: int, name: str, default: Any = None) -> Any:
    """A wrapped method's argument by position (self excluded) or keyword."""
    if name in kwargs:
        return kwargs[name]
    return args[index] if len(args) > index else default


def session_key(session: Any) -> Any:
    """LMDeploy passes a Session object or an int session id; the int is the stable key."""
    return getattr(session, "session_id", session)


def _image_size(item: Any) -> tuple[int, int] | None:
    size = getattr(item, "size", None)
    if isinstance(size, tuple) and len(size) == 2 and all(isinstance(v, int) for v in size):
        return size
    return None


def images_in_content(content: Any) -> list[Any]:
    """The image objects (PIL images, URLs, dicts) in one message's content list."""
    if not isinstance(content, list):
        return []
    found = []
    for item in content:
        if isinstance(item, dict) and item.get("type") in IMAGE_CONTENT_TYPES:
            image = item.get("data") or item.get(item["type"])
            if isinstance(image, dict):  # {"data": PIL image} or {"url": ...}
                image = image.get("data") or image.get("url")
            found.append(image)
    return found


def images_in_messages(messages: Any) -> list[Any]:
    if isinstance(messages, list):
        return [
            image
            for message in messages
            if isinstance(message, dict)
            for image in images_in_content(message.get("content"))
        ]
    return []


def images_in_prompt(prompt: Any) -> list[Any]:
    """A pipeline prompt: a string, a (text, image or [images]) pair, or OpenAI-style messages."""
    if isinstance(prompt, tuple) and len(prompt) == 2:
        images = prompt[1] if not isinstance(prompt[1], str) else prompt[0]
        return list(images) if isinstance(images, list) else [images]
    return images_in_messages(prompt)


def split_prompts(prompts: Any) -> list[Any]:
    """The pipeline's own rule for one prompt versus a batch of them."""
    single = (
        isinstance(prompts, str)
        or (isinstance(prompts, tuple) and len(prompts) == 2)
        or (isinstance(prompts, list) and len(prompts) > 0 and isinstance(prompts[0], dict))
    )
    return [prompts] if single else list(prompts)


def image_sizes(images: list[Any]) -> list[tuple[int, int]]:
    return [size for size in map(_image_size, images) if size is not None]


def _image_facts_in_python(messages: Any) -> tuple[int, list[tuple[int, int]]]:
    images = images_in_messages(messages)
    return len(images), image_sizes(images)


def _image_facts() -> Callable[[Any], tuple[int, list[tuple[int, int]]]]:
    core = compiled.core()
    return core.image_sizes if core is not None else _image_facts_in_python


# image_facts(messages): how many images OpenAI-style messages hold, and the (width, height) of those that have
# one, read while the request's objects are alive: the compiled core's one walk, or the same in Python.
image_facts = _image_facts()


def input_messages(messages: Any, max_chars: int) -> list[dict[str, Any]]:
    """A prompt in the GenAI conventions' `gen_ai.input.messages` form, for the opt-in content capture:
    each message's role and parts, text cut to `max_chars` per part, and an `image` part without content
    for each image (image data is never recorded)."""

    def text(content: str) -> dict[str, Any]:
        return {"type": "text", "content": content[:max_chars]}

    if isinstance(messages, str):
        return [{"role": "user", "parts": [text(messages)]}]
    if isinstance(messages, tuple) and len(messages) == 2:
        words = next((part for part in messages if isinstance(part, str)), "")
        return [{"role": "user", "parts": [text(words)] + [{"type": "image"} for _ in images_in_prompt(messages)]}]
    found = []
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        parts: list[dict[str, Any]] = []
        if isinstance(content, str):
            parts.append(text(content))
        for item in content if isinstance(content, list) else []:
            kind = item.get("type") if isinstance(item, dict) else None
            if kind == "text":
                parts.append(text(str(item.get("text", ""))))
            elif kind in IMAGE_CONTENT_TYPES:
                parts.append({"type": "image"})
        found.append({"role": str(message.get("role", "user")), "parts": parts})
    return found
