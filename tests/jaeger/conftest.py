"""A real Jaeger (v2, in-memory storage) on free 127.0.0.1 ports, one per test session.

`scripts/build-jaeger` (run by `scripts/setup dev`) builds it into build/jaeger. Without that binary
the tests here are skipped, except in CI (`CI=true`), where a missing Jaeger is a failure.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import _free_port, stop_process

REPO = Path(__file__).resolve().parents[2]
JAEGER_BINARY = REPO / "build" / "jaeger"
CONFIG = Path(__file__).with_name("jaeger.yaml")
_START_ATTEMPTS = 3
START_TIMEOUT_S = 60.0  # the first start of a fresh binary on a busy 2-core machine takes a few seconds
_PORTS = (
    "JAEGER_OTLP_GRPC_PORT",
    "JAEGER_OTLP_HTTP_PORT",
    "JAEGER_QUERY_HTTP_PORT",
    "JAEGER_QUERY_GRPC_PORT",
    "JAEGER_HEALTH_PORT",
)


class JaegerServer:
    """A running Jaeger: OTLP in (`otlp_grpc_endpoint`, `otlp_http_endpoint`), its query API out (`query_url`)."""

    def __init__(self, binary: Path, workdir: Path) -> None:
        self._binary = binary
        self._log = workdir / "jaeger.log"
        self._process: subprocess.Popen[bytes] | None = None
        self.ports = {name: _free_port() for name in _PORTS}

    @property
    def otlp_grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['JAEGER_OTLP_GRPC_PORT']}"

    @property
    def otlp_http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['JAEGER_OTLP_HTTP_PORT']}"

    @property
    def query_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['JAEGER_QUERY_HTTP_PORT']}"

    def start(self) -> None:
        """Start and wait until healthy; on new ports if it exits at once (a port taken since it was probed)."""
        for _ in range(_START_ATTEMPTS):
            exited = self._start_once()
            if not exited:
                return
            self.ports = {name: _free_port() for name in _PORTS}
        raise RuntimeError(f"jaeger did not start: {exited}")

    def _start_once(self) -> str:
        env = {**os.environ, **{name: str(port) for name, port in self.ports.items()}}
        with open(self._log, "wb") as log:
            self._process = subprocess.Popen(
                [str(self._binary), "--config", str(CONFIG)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        health = f"http://127.0.0.1:{self.ports['JAEGER_HEALTH_PORT']}/status"
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return f"exited with {self._process.returncode}: {self.log()[-3000:]}"
            try:
                with urllib.request.urlopen(health, timeout=1) as response:
                    if response.status == 200:
                        return ""
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)  # polling a starting server, bounded by the deadline
        self.stop()
        raise RuntimeError(f"jaeger was not healthy within {START_TIMEOUT_S}s: {self.log()[-3000:]}")

    def stop(self) -> None:
        process, self._process = self._process, None
        stop_process(process, grace_s=10)

    def log(self) -> str:
        return self._log.read_text(errors="replace") if self._log.exists() else ""

    def get(self, path: str, params: dict | None = None) -> Any:
        """A query API response as JSON; 404 gives None (Jaeger's answer for a trace it does not have yet)."""
        url = self.query_url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return orjson.loads(response.read())
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            raise

    def wait_for(
        self, path: str, ready: Callable[[Any], bool], params: dict | None = None, timeout: float = 30.0
    ) -> Any:
        """Poll the query API until `ready(response)`; the exporter was flushed, so this waits only on storage."""
        deadline = time.monotonic() + timeout
        while True:
            document = self.get(path, params)
            if document is not None and ready(document):
                return document
            if time.monotonic() >= deadline:
                pytest.fail(f"Jaeger did not answer {path} as expected within {timeout}s; last: {str(document)[:500]}")
            time.sleep(0.1)


ALL_TIME = {"query.start_time_min": "2000-01-01T00:00:00Z", "query.start_time_max": "2100-01-01T00:00:00Z"}


def v3_span_count(document: dict) -> int:
    """How many spans an API v3 response holds."""
    return sum(
        len(scope["spans"]) for resource in document["result"]["resourceSpans"] for scope in resource["scopeSpans"]
    )


def jaeger_binary() -> Path:
    """build/jaeger, or skip (fail under CI=true: CI must run these tests)."""
    if os.access(JAEGER_BINARY, os.X_OK):
        return JAEGER_BINARY
    reason = f"{JAEGER_BINARY.relative_to(REPO)} is missing: scripts/build-jaeger builds it (needs Go)"
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def jaeger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JaegerServer]:
    server = JaegerServer(jaeger_binary(), tmp_path_factory.mktemp("jaeger"))
    server.start()
    try:
        yield server
    finally:
        server.stop()
