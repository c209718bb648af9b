"""Options for `instrument()`: keyword arguments win over VLMTRACE_* variables, which win over OTEL_*.

Each option's environment variable, default and meaning are listed in README.md; `Options.describe()`
feeds `vlmtrace doctor`, so the table and the code cannot drift apart silently.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

_log = logging.getLogger("vlmtrace")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
OTLP_PROTOCOLS = ("grpc", "http/protobuf")
PROBE_NAMES = ("torch", "nvml", "host")


def _env(environ: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = environ.get(name)
        if value is not None and value.strip() != "":
            return value.strip()
    return None


def _parse_bool(name: str, text: str) -> bool:
    lowered = text.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"{name}={text!r} is not a boolean (use true/false)")


def _parse_int(name: str, text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not an integer") from None
    if value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}")
    return value


@dataclasses.dataclass(frozen=True)
class Options:
    service_name: str = "lmdeploy"
    journal: str | None = "vlmtrace-journal"
    journal_max_bytes: int = 64 * 1024 * 1024
    journal_max_files: int = 8
    journal_sync: bool = False
    sample_interval_ms: int = 100
    otlp_endpoint: str | None = None
    otlp_protocol: str = "http/protobuf"
    otlp_max_queue_size: int = 2048
    shutdown_timeout_ms: int = 2000
    capture_content: bool = False
    probes: tuple[str, ...] = PROBE_NAMES
    devices: tuple[int, ...] | None = None
    probe_reuse_us: int = 200
    metrics: bool = True

    @classmethod
    def resolve(cls, overrides: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> Options:
        """Merge keyword overrides, VLMTRACE_* and OTEL_* variables; reject bad values with their name."""
        environ = os.environ if environ is None else environ
        overrides = dict(overrides or {})
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise TypeError(f"unknown vlmtrace option(s): {', '.join(sorted(unknown))}")
        values: dict[str, Any] = {}

        text = _env(environ, "OTEL_SERVICE_NAME")
        if text:
            values["service_name"] = text
        text = _env(environ, "VLMTRACE_JOURNAL")
        if text is not None:
            values["journal"] = None if text.lower() in _FALSE - {""} else text
        for field, name, minimum in (
            ("journal_max_bytes", "VLMTRACE_JOURNAL_MAX_BYTES", 4096),
            ("journal_max_files", "VLMTRACE_JOURNAL_MAX_FILES", 1),
            ("sample_interval_ms", "VLMTRACE_SAMPLE_INTERVAL_MS", 0),
            ("otlp_max_queue_size", "OTEL_BSP_MAX_QUEUE_SIZE", 1),
            ("shutdown_timeout_ms", "VLMTRACE_SHUTDOWN_TIMEOUT_MS", 0),
            ("probe_reuse_us", "VLMTRACE_PROBE_REUSE_US", 0),
        ):
            text = _env(environ, name)
            if text is not None:
                values[field] = _parse_int(name, text, minimum)
        text = _env(environ, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
        if text:
            values["otlp_endpoint"] = text
        text = _env(environ, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
        if text:
            values["otlp_protocol"] = text
        for field, names in (
            ("capture_content", ("VLMTRACE_CAPTURE_CONTENT", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT")),
            ("metrics", ("VLMTRACE_METRICS",)),
            ("journal_sync", ("VLMTRACE_JOURNAL_SYNC",)),
        ):
            text = _env(environ, *names)
            if text is not None:
                values[field] = _parse_bool(names[0], text)
        text = _env(environ, "VLMTRACE_PROBES")
        if text is not None:
            values["probes"] = tuple(p.strip() for p in text.split(",") if p.strip())
        text = _env(environ, "VLMTRACE_DEVICES")
        if text is not None:
            values["devices"] = tuple(_parse_int("VLMTRACE_DEVICES", p, 0) for p in text.split(",") if p.strip())

        values.update(overrides)
        if values.get("journal") is False:
            values["journal"] = None
        if isinstance(values.get("journal"), os.PathLike):
            values["journal"] = os.fspath(values["journal"])
        for key in ("probes", "devices"):
            if isinstance(values.get(key), list):
                values[key] = tuple(values[key])
        options = cls(**values)
        options._validate()
        return options

    def _validate(self) -> None:
        if self.otlp_protocol not in OTLP_PROTOCOLS:
            raise ValueError(f"OTLP protocol {self.otlp_protocol!r} is not one of {', '.join(OTLP_PROTOCOLS)}")
        bad = [p for p in self.probes if p not in PROBE_NAMES]
        if bad:
            raise ValueError(f"unknown probe(s) {', '.join(bad)}; choose from {', '.join(PROBE_NAMES)}")

    def describe(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
