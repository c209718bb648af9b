"""Shared fixtures: a real OTLP collector (rotel) on loopback, and a clean global tracer provider.

`otlp_collector` starts `rotel-agent` on free 127.0.0.1 ports with its debug exporter, which prints
every received span and metric; `wait_for_spans` parses that text into `ReceivedSpan`s with typed
attribute values (Int -> int, Double -> float, Bool -> bool, Str -> str, Slice -> list), and
`wait_for_points` into `ReceivedPoint`s (one per metric data point).
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

_START_TIMEOUT_S = 15.0
_ROTEL_ATTEMPTS = 3


@dataclasses.dataclass
class ReceivedSpan:
    """One span as the collector received it."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    kind: str  # "INTERNAL", "SERVER", ... (the SPAN_KIND_ prefix removed)
    start_ns: int
    end_ns: int
    status_code: str  # "UNSET", "OK", "ERROR"
    status_message: str
    attributes: dict[str, Any]
    events: list[dict[str, Any]]  # {"name", "t", "attributes"}
    links: list[dict[str, str]]  # {"trace_id", "span_id"}
    resource: dict[str, Any]


@dataclasses.dataclass
class ReceivedPoint:
    """One metric data point as the collector received it."""

    metric: str
    unit: str
    data_type: str  # "Sum", "Gauge", "Histogram"
    monotonic: bool | None  # for a Sum
    attributes: dict[str, Any]
    resource: dict[str, Any]
    value: float | None = None  # Sum and Gauge
    count: int | None = None  # Histogram
    sum: float | None = None  # Histogram
    bounds: list[float] = dataclasses.field(default_factory=list)
    bucket_counts: list[int] = dataclasses.field(default_factory=list)
    exemplar_trace_ids: list[str] = dataclasses.field(default_factory=list)  # Histogram: the traces it links to


_TYPED = re.compile(r"(\w+)\(")
_STR_END = re.compile(r"\)(?=\)*$|, (?:Str|Int|Double|Bool|Slice|Map|Bytes)\()")


def parse_value(text: str) -> Any:
    """Parse rotel's `Int(3)`, `Slice(Int(1), Int(2))`, `Str(a b)` notation into a Python value."""
    value, end = _parse_value_at(text, 0)
    return value if end == len(text) else text


def _parse_value_at(text: str, i: int) -> tuple[Any, int]:
    match = _TYPED.match(text, i)
    if match is None:
        raise ValueError(f"not a typed value at {i}: {text!r}")
    kind, start = match.group(1), match.end()
    if kind == "Slice":
        items = []
        j = start
        while text[j] != ")":
            item, j = _parse_value_at(text, j)
            items.append(item)
            if text.startswith(", ", j):
                j += 2
        return items, j + 1
    if kind == "Str":
        end = _STR_END.search(text, start)
        stop = end.start() if end else len(text) - 1
        return text[start:stop], stop + 1
    stop = text.index(")", start)
    raw = text[start:stop]
    if kind == "Int":
        return int(raw), stop + 1
    if kind == "Double":
        return float(raw), stop + 1
    if kind == "Bool":
        return raw == "true", stop + 1
    return raw, stop + 1


def parse_rotel_output(text: str) -> list[ReceivedSpan]:
    """All spans in rotel's `--debug-log traces --debug-log-verbosity detailed` output."""
    spans: list[ReceivedSpan] = []
    resource: dict[str, Any] = {}
    section = ""
    span: ReceivedSpan | None = None
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if line.startswith("{") or not line:
            continue
        if line.startswith("ResourceSpans #"):
            resource, section, span = {}, "resource", None
        elif line.startswith("ResourceMetrics #") or section == "metrics":  # parse_rotel_metrics reads those
            section, span = "metrics", None
        elif line == "Resource attributes:":
            section = "resource"
        elif line.startswith("Span #"):
            span = ReceivedSpan("", "", "", None, "", 0, 0, "", "", {}, [], [], resource)
            spans.append(span)
            section = "span"
        elif span is None:
            if section == "resource" and line.startswith("-> "):
                key, _, value = line[3:].partition(": ")
                resource[key] = parse_value(value)
        elif line == "Attributes:":
            section = "attributes"
        elif line == "Events:":
            section = "events"
        elif line == "Links:":
            section = "links"
        elif line.startswith("SpanEvent #"):
            span.events.append({"name": "", "t": 0, "attributes": {}})
        elif line.startswith("SpanLink #"):
            span.links.append({"trace_id": "", "span_id": ""})
        elif line.startswith("-> "):
            key, _, value = line[3:].partition(": ")
            _add_arrow_field(span, section, raw_line, key, value)
        else:
            key, _, value = line.partition(":")
            _set_span_field(span, key.strip(), value.strip())
    return spans


def parse_rotel_metrics(text: str) -> list[ReceivedPoint]:
    """All metric data points in rotel's `--debug-log metrics --debug-log-verbosity detailed` output."""
    points: list[ReceivedPoint] = []
    resource: dict[str, Any] = {}
    descriptor: dict[str, str] = {}
    point: ReceivedPoint | None = None
    section = ""
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if line.startswith("{") or not line:
            continue
        if line.startswith("ResourceSpans #"):
            section, point = "", None
        elif line.startswith("ResourceMetrics #"):
            resource, section, point = {}, "resource", None
        elif section == "":
            continue
        elif line.startswith("Metric #"):
            descriptor, point, section = {}, None, "metric"
        elif line == "Descriptor:":
            section = "descriptor"
        elif line.startswith(("NumberDataPoints #", "HistogramDataPoints #")):
            point = ReceivedPoint(
                descriptor.get("Name", ""),
                descriptor.get("Unit", ""),
                descriptor.get("DataType", ""),
                {"true": True, "false": False}.get(descriptor.get("IsMonotonic", "")),
                {},
                resource,
            )
            points.append(point)
            section = "point"
        elif line == "Data point attributes:":
            section = "point attributes"
        elif line.startswith(("Exemplars:", "Exemplar #")):
            section = "exemplars"
        elif line.startswith("-> ") and section == "exemplars":
            key, _, value = line[3:].partition(": ")
            if key == "Trace ID" and point is not None:
                point.exemplar_trace_ids.append(value)
        elif line.startswith("-> "):
            key, _, value = line[3:].partition(": ")
            if section == "resource":
                resource[key] = parse_value(value)
            elif section == "descriptor":
                descriptor[key] = value
            elif section == "point attributes" and point is not None:
                point.attributes[key] = parse_value(value)
        elif point is not None:
            key, _, value = line.partition(": ")
            if key == "Value":
                point.value = float(value)
            elif key == "Count":
                point.count = int(value)
            elif key == "Sum":
                point.sum = float(value)
            elif key.startswith("ExplicitBounds #"):
                point.bounds.append(float(value))
            elif key.startswith("Buckets #"):
                point.bucket_counts.append(int(line.rpartition("Count: ")[2]))
    return points


def _add_arrow_field(span: ReceivedSpan, section: str, raw_line: str, key: str, value: str) -> None:
    if section == "attributes":
        span.attributes[key] = parse_value(value)
    elif section == "events" and span.events:
        event = span.events[-1]
        if raw_line.startswith("          "):  # deeper indentation: the event's own attributes
            event["attributes"][key] = parse_value(value)
        elif key == "Name":
            event["name"] = value
        elif key == "Timestamp":
            event["t"] = int(value)
    elif section == "links" and span.links:
        if key == "Trace ID":
            span.links[-1]["trace_id"] = value
        elif key == "ID":
            span.links[-1]["span_id"] = value


def _set_span_field(span: ReceivedSpan, key: str, value: str) -> None:
    if key == "Trace ID":
        span.trace_id = value
    elif key == "Parent ID":
        span.parent_id = value or None
    elif key == "ID":
        span.span_id = value
    elif key == "Name":
        span.name = value
    elif key == "Kind":
        span.kind = value.removeprefix("SPAN_KIND_")
    elif key == "Start time":
        span.start_ns = int(value)
    elif key == "End time":
        span.end_ns = int(value)
    elif key == "Status code":
        span.status_code = value.removeprefix("STATUS_CODE_")
    elif key == "Status message":
        span.status_message = value


def rotel_binary() -> str | None:
    try:
        import rotel
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(rotel.__file__), "rotel-agent")
    return path if os.access(path, os.X_OK) else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def stop_process(process: subprocess.Popen | None, grace_s: float = 5.0) -> None:
    """Terminate a server started by a fixture, kill it if it does not exit within `grace_s`."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class RotelCollector:
    """A running rotel-agent; `grpc_endpoint` and `http_endpoint` are `http://127.0.0.1:PORT` base URLs."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self._binary = binary
        self._workdir = workdir
        self._stdout_path = workdir / "rotel-stdout.txt"
        self._process: subprocess.Popen[bytes] | None = None
        self.grpc_port = 0
        self.http_port = 0

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def http_traces_url(self) -> str:
        return f"{self.http_endpoint}/v1/traces"

    def start(self) -> None:
        """Start on free ports; after stop(), start again on the same ports (a collector coming back)."""
        failure = ""
        for _ in range(_ROTEL_ATTEMPTS):
            if not self.grpc_port or failure:  # a free port can be taken between probing and binding
                self.grpc_port, self.http_port = _free_port(), _free_port()
            failure = self._start_once()
            if not failure:
                return
        raise RuntimeError(f"rotel-agent did not start: {failure}")

    def _start_once(self) -> str:
        stdout = open(self._stdout_path, "wb")  # noqa: SIM115 - the process owns it until stop()
        stderr_path = self._workdir / "rotel-stderr.txt"
        with stdout, open(stderr_path, "wb") as stderr:
            self._process = subprocess.Popen(
                [
                    self._binary, "--log-format", "json", "start",
                    "--otlp-grpc-endpoint", f"127.0.0.1:{self.grpc_port}",
                    "--otlp-http-endpoint", f"127.0.0.1:{self.http_port}",
                    "--exporter", "blackhole",
                    "--debug-log", "traces", "--debug-log", "metrics", "--debug-log-verbosity", "detailed",
                    "--disable-batching",
                    "--pid-file", str(self._workdir / "rotel.pid"),
                    "--log-file", str(self._workdir / "rotel.log"),
                ],
                stdout=stdout,
                stderr=stderr,
                stdin=subprocess.DEVNULL,
                cwd=self._workdir,
            )  # fmt: skip
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return f"exited with {self._process.returncode}: {stderr_path.read_text(errors='replace')[-2000:]}"
            if _accepts(self.grpc_port) and _accepts(self.http_port):
                return ""
            time.sleep(0.02)
        self.stop()
        return f"not listening after {_START_TIMEOUT_S}s"

    def stop(self) -> None:
        process, self._process = self._process, None
        stop_process(process)

    def output(self) -> str:
        return self._stdout_path.read_text(errors="replace") if self._stdout_path.exists() else ""

    def spans(self) -> list[ReceivedSpan]:
        """Every span received so far."""
        return parse_rotel_output(self.output())

    def wait_for_spans(
        self,
        count: int = 1,
        *,
        where: Callable[[ReceivedSpan], bool] | None = None,
        timeout: float = 15.0,
    ) -> list[ReceivedSpan]:
        """Wait until at least `count` received spans satisfy `where`; returns them (fails the test on timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            matching = [span for span in self.spans() if where is None or where(span)]
            if len(matching) >= count or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        if len(matching) < count:
            names = [span.name for span in self.spans()]
            pytest.fail(f"collector received {len(matching)} matching spans of {count} within {timeout}s; all: {names}")
        time.sleep(0.05)  # let rotel finish printing the last block, then read it whole
        return [span for span in self.spans() if where is None or where(span)]

    def points(self) -> list[ReceivedPoint]:
        """Every metric data point received so far."""
        return parse_rotel_metrics(self.output())

    def wait_for_points(
        self,
        where: Callable[[ReceivedPoint], bool],
        *,
        timeout: float = 15.0,
    ) -> list[ReceivedPoint]:
        """Wait until a received data point satisfies `where`; returns all that do (fails the test on timeout)."""
        deadline = time.monotonic() + timeout
        while not any(where(point) for point in self.points()):
            if time.monotonic() >= deadline:
                names = sorted({point.metric for point in self.points()})
                pytest.fail(f"collector received no matching metric point within {timeout}s; metrics: {names}")
            time.sleep(0.05)
        time.sleep(0.05)  # let rotel finish printing the last block, then read it whole
        return [point for point in self.points() if where(point)]


@pytest.fixture
def otlp_collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RotelCollector]:
    """A fresh rotel collector on 127.0.0.1 for one test; skipped where rotel is not installed."""
    binary = rotel_binary()
    if binary is None:
        pytest.skip("rotel is not installed (pip install --pre rotel)")
    collector = RotelCollector(binary, tmp_path_factory.mktemp("rotel"))
    collector.start()
    try:
        yield collector
    finally:
        collector.stop()


@pytest.fixture
def fresh_global_tracer_provider() -> Iterator[None]:
    """Let a test install the global tracer provider, and forget it afterwards.

    The API allows setting it once per process; like OpenTelemetry's own test utilities,
    this resets the private guard so every test starts with none installed.
    """
    from opentelemetry import trace
    from opentelemetry.util._once import Once

    def reset() -> None:
        trace._TRACER_PROVIDER_SET_ONCE = Once()
        trace._TRACER_PROVIDER = None

    reset()
    try:
        yield
    finally:
        reset()


@pytest.fixture
def fresh_global_meter_provider() -> Iterator[None]:
    """As fresh_global_tracer_provider, for the global meter provider."""
    from opentelemetry.metrics import _internal
    from opentelemetry.util._once import Once

    def reset() -> None:
        _internal._METER_PROVIDER_SET_ONCE = Once()
        _internal._METER_PROVIDER = None
        _internal._PROXY_METER_PROVIDER = _internal._ProxyMeterProvider()

    reset()
    try:
        yield
    finally:
        reset()


@pytest.fixture
def fresh_global_logger_provider() -> Iterator[None]:
    """As fresh_global_tracer_provider, for the global logger provider (the Logs API)."""
    from opentelemetry._logs import _internal
    from opentelemetry.util._once import Once

    def reset() -> None:
        _internal._LOGGER_PROVIDER_SET_ONCE = Once()
        _internal._LOGGER_PROVIDER = None

    reset()
    try:
        yield
    finally:
        reset()
