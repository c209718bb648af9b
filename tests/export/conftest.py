"""Fixtures for the export tests."""

from __future__ import annotations

import faulthandler
import socket
import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def faulthandler_off() -> Iterator[None]:
    """pytest enables faulthandler itself; journals opened in-process would (rightly) leave it alone.

    Tests start with it off, as in a service that did not enable it, and get pytest's back after.
    """
    was_enabled = faulthandler.is_enabled()
    faulthandler.disable()
    yield
    faulthandler.disable()
    if was_enabled:
        faulthandler.enable(file=sys.__stderr__, all_threads=True)


@pytest.fixture
def refused_endpoint() -> Iterator[str]:
    """An OTLP endpoint that refuses connections: a loopback port held bound but not listening."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{held.getsockname()[1]}"


@pytest.fixture
def blackhole_endpoint() -> Iterator[str]:
    """An OTLP endpoint that accepts connections and never answers (a hung collector)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
