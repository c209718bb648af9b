"""Options for `instrument()`: keyword arguments win over VLMTRACE_* variables, which win over OTEL_*.

Each option's environment variable, default and meaning are listed in README.md; `Options.describe()`
feeds `vlmtrace doctor`, so the table and the code cannot drift apart silently.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Mapping
from typing import Any

_log = logging.getLogger("vlmtrace")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
OTLP_PROTOCOLS = ("grpc", "http/protobuf")
PROBE_NAMES = ("torch", "nvml", "host")
# Binary units only: "GB" means 10**9 to some and 2**30 to others (PYTORCH_CUDA_ALLOC_CONF's "MB" is MiB).
_SIZE_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
HEADROOM_PREFIX = "headroom="
CACHED, HEADROOM = "cached", "headroom"  # the kinds of CacheBound


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


def parse_size(name: str, text: str) -> int:
    """Bytes from "2GiB", "512 MiB", "1.5GiB" or a plain count of bytes."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise ValueError(f"{name}={text!r} is not a size (bytes, or a number with KiB, MiB, GiB or TiB)")
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


@dataclasses.dataclass(frozen=True)
class CacheBound:
    """When the cache guard trims torch's cache (docs/cache-guard.md).
    `cached`: trim a device whose torch cache (reserved - allocated) exceeds `limit_bytes`.
    `headroom`: trim a device whose free memory (NVML: total - used, every allocator and process
    counted) falls below `limit_bytes`."""

    kind: str  # CACHED or HEADROOM
    limit_bytes: int

    @classmethod
    def parse(cls, name: str, value: Any) -> CacheBound | None:
        """From the option's value: a CacheBound, bytes (int), "2GiB", "headroom=4GiB"; None, False,
        0 and "off" turn the guard off."""
        if isinstance(value, cls) or value is None:
            return value
        if value is False or value == 0:
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            kind, limit = CACHED, value
        elif isinstance(value, str):
            text = value.strip()
            if text.lower() in _FALSE:
                return None
            headroom = text.lower().startswith(HEADROOM_PREFIX)
            kind = HEADROOM if headroom else CACHED
            limit = parse_size(f"{name} headroom" if headroom else name, text[len(HEADROOM_PREFIX):] if headroom else text)
        else:
            raise TypeError(f"{name}={value!r} is not a size or headroom=SIZE")
        if limit <= 0:
            raise ValueError(f"{name}={value!r} must be more than 0 bytes (or off)")
        return cls(kind, limit)

    def __str__(self) -> str:
        return f"{HEADROOM_PREFIX}{self.limit_bytes}" if self.kind == HEADROOM else str(self.limit_bytes)


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
    trim_cache: CacheBound | None = None
    trim_cache_interval_ms: int = 5000
    native_counters: bool = True  # the compiled counter read (probes/native_counters.py; docs/benchmarks.md)

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
            ("trim_cache_interval_ms", "VLMTRACE_TRIM_CACHE_INTERVAL_MS", 0),
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
            ("native_counters", ("VLMTRACE_NATIVE_COUNTERS",)),
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
        text = _env(environ, "VLMTRACE_TRIM_CACHE")
        if text is not None:
            values["trim_cache"] = CacheBound.parse("VLMTRACE_TRIM_CACHE", text)

        values.update(overrides)
        if values.get("journal") is False:
            values["journal"] = None
        if isinstance(values.get("journal"), os.PathLike):
            values["journal"] = os.fspath(values["journal"])
        for key in ("probes", "devices"):
            if isinstance(values.get(key), list):
                values[key] = tuple(values[key])
        if "trim_cache" in overrides:
            values["trim_cache"] = CacheBound.parse("trim_cache", overrides["trim_cache"])
        options = cls(**values)
        options._validate()
        return options

    def _validate(self) -> None:
        if self.otlp_protocol not in OTLP_PROTOCOLS:
            raise ValueError(f"OTLP protocol {self.otlp_protocol!r} is not one of {', '.join(OTLP_PROTOCOLS)}")
        bad = [p for p in self.probes if p not in PROBE_NAMES]
        if bad:
            raise ValueError(f"unknown probe(s) {', '.join(bad)}; choose from {', '.join(PROBE_NAMES)}")
        if self.trim_cache is not None and self.sample_interval_ms <= 0:
            raise ValueError("trim_cache needs the background sampler: set sample_interval_ms "
                             "(VLMTRACE_SAMPLE_INTERVAL_MS) above 0")
        if self.trim_cache_interval_ms < 0:
            raise ValueError(f"trim_cache_interval_ms={self.trim_cache_interval_ms} must be >= 0")

    def describe(self) -> dict[str, Any]:
        described = dataclasses.asdict(self)
        described["trim_cache"] = str(self.trim_cache) if self.trim_cache is not None else None
        return described
