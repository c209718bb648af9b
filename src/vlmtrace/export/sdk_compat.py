"""The one place vlmtrace reaches into the OpenTelemetry SDK's private attributes, each with a public fallback.

The SDK has no public way to read a span's bounded containers without copying them (the journal's span
processor), to add to the Resource of the provider `vlmtrace.configure()` installed, nor to keep a
periodic metric reader from exporting in a forked child, nor to tell whether a MeterProvider was shut down.
Each function here tries the private attribute of the SDK versions the test suite runs on (the export
tests run against the newest SDK release in CI: scripts/test-newest-sdk) and, where the SDK has changed,
falls back to the public API with the behaviour its docstring gives, never to an error.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan


def update_resource(provider: Any, attributes: Mapping[str, Any]) -> bool:
    """Merge `attributes` into the provider's Resource (its tracers' included); False where the SDK cannot."""
    update = getattr(provider, "_update_resource", None)
    if update is None:
        return False
    update(Resource(dict(attributes)))
    return True


def meter_provider_shut_down(provider: Any) -> bool:
    """Whether the MeterProvider's owner shut it down already (the SDK's `_shutdown`): the exit hook of
    `vlmtrace.configure()` then leaves it, where a second shutdown would print the SDK's "shutdown can only
    be called once". Fallback: False (that line, once)."""
    return getattr(provider, "_shutdown", False) is True


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

    # The SDK marks collect final; a forked child must still not collect through its parent's reader.
    def collect(self, timeout_millis: float = 10_000) -> None:  # type: ignore[misc]
        if os.getpid() == self._owner_pid:
            super().collect(timeout_millis=timeout_millis)

    def _at_fork_reinit(self) -> None:
        self._daemon_thread = None
