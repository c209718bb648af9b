"""The one place vlmtrace reaches into the OpenTelemetry SDK's private attributes, each with a public fallback.

The SDK has no public way to list, order or remove a provider's span processors, to read its span
limits, to change its Resource, or to read a span's bounded containers without copying them. Each
function here tries the private attribute of the SDK versions pyproject.toml allows (the export tests
run against the newest SDK release in CI: scripts/test-newest-sdk) and, where the SDK has changed,
falls back to the public API with the behaviour its docstring gives, never to an error.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, SpanProcessor


def _fan_out_with_list(provider: Any) -> tuple[Any, threading.Lock] | None:
    """The provider's multi-span-processor and its lock, where its processor tuple is as the SDK keeps it."""
    fan_out = getattr(provider, "_active_span_processor", None)
    lock = getattr(fan_out, "_lock", None)
    if lock is None or not isinstance(getattr(fan_out, "_span_processors", None), tuple):
        return None
    return fan_out, lock


def span_processors(provider: Any) -> tuple[SpanProcessor, ...] | None:
    """The processors registered on an SDK provider, or None where they cannot be listed."""
    found = _fan_out_with_list(provider)
    return found[0]._span_processors if found is not None else None


def fan_out(provider: Any, scope: str) -> SpanProcessor | None:
    """The span processor through which the provider reaches all of its processors.

    Fallback: an SDK tracer keeps the same object in its (public) `span_processor` attribute.
    """
    active = getattr(provider, "_active_span_processor", None)
    if isinstance(active, SpanProcessor):
        return active
    processor = getattr(provider.get_tracer(scope), "span_processor", None)
    return processor if isinstance(processor, SpanProcessor) else None


def add_span_processor_first(provider: Any, processor: SpanProcessor) -> bool:
    """Register `processor` before the provider's others, so its force_flush and shutdown run first;
    False where it could only be appended (the public `add_span_processor`): the caller's force_flush
    must then flush the others again itself, and on the provider's shutdown those registered before
    it are already closed."""
    found = _fan_out_with_list(provider)
    if found is None:
        provider.add_span_processor(processor)
        return False
    fan_out_processor, lock = found
    with lock:
        fan_out_processor._span_processors = (processor, *fan_out_processor._span_processors)
    return True


def remove_span_processors(provider: Any, processors: Iterable[SpanProcessor]) -> None:
    """Take our processors off a provider that may outlive them.

    Fallback: they stay attached, inert (each ignores spans once shut down).
    """
    found = _fan_out_with_list(provider)
    if found is None:
        return
    fan_out_processor, lock = found
    leaving = set(map(id, processors))
    with lock:
        fan_out_processor._span_processors = tuple(
            p for p in fan_out_processor._span_processors if id(p) not in leaving)


def span_limits(provider: Any) -> SpanLimits:
    """The limits the provider applies to its spans. Fallback: SpanLimits() (the OTEL_SPAN_* variables)."""
    limits = getattr(provider, "_span_limits", None)
    return limits if isinstance(limits, SpanLimits) else SpanLimits()


def update_resource(provider: Any, resource: Resource) -> bool:
    """Merge `resource` into the provider's Resource (its tracers included); False where the SDK cannot."""
    update = getattr(provider, "_update_resource", None)
    if update is None:
        return False
    update(resource)
    return True


def attribute_mapping(attributes: Any) -> Mapping[str, Any]:
    """Attributes as a plain dict, without copying where the SDK keeps one.

    The SDK's BoundedAttributes keeps a plain dict in `_dict`; reading through its Mapping interface
    takes a lock and a Python call per key, about 15 times the cost of the dict. Fallback: a copy.
    """
    if not attributes:
        return {}
    inner = getattr(attributes, "_dict", attributes)
    return inner if isinstance(inner, dict) else dict(inner)


def _bounded_items(bounded: Any) -> Sequence[Any]:
    """The items of a BoundedList (its deque `_dq`) without the locked copy its iterator makes (~1.4 µs)."""
    return getattr(bounded, "_dq", bounded) or ()


def span_attributes(span: ReadableSpan) -> Mapping[str, Any]:
    """A span's attributes, uncopied (see attribute_mapping). Fallback: the public `attributes`."""
    return attribute_mapping(getattr(span, "_attributes", None) or span.attributes)


def span_links(span: ReadableSpan) -> Sequence[Any]:
    """A span's links, uncopied. Fallback: the public `links`."""
    links = getattr(span, "_links", None)
    return _bounded_items(links) if links is not None else span.links


def span_events(span: ReadableSpan) -> Sequence[Any]:
    """A span's events, uncopied. Fallback: the public `events`."""
    events = getattr(span, "_events", None)
    return _bounded_items(events) if events is not None else span.events


class ParentOnlyMetricReader(PeriodicExportingMetricReader):
    """A periodic reader that exports only in the process that created it.

    A forked child must not export vlmtrace's metrics: it would report its parent's cumulative
    numbers under the parent's Resource (the SDK restarts the reader's thread in every fork). A
    spawned child that imports lmdeploy instruments itself, with its own provider. The SDK's
    private fork hook `_at_fork_reinit` keeps the child from starting the thread at all; where it
    no longer exists, the public `collect()` does nothing outside the parent.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._owner_pid = os.getpid()
        super().__init__(*args, **kwargs)

    def collect(self, timeout_millis: float = 10_000) -> None:
        if os.getpid() == self._owner_pid:
            super().collect(timeout_millis=timeout_millis)

    def _at_fork_reinit(self) -> None:
        self._daemon_thread = None
