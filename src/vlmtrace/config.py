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

_log = logging.getLogger(__name__)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
OTLP_PROTOCOLS = ("grpc", "http/protobuf")
PROBE_NAMES = ("torch", "nvml", "host")
# Binary units only: "GB" means 10**9 to some and 2**30 to others (PYTORCH_CUDA_ALLOC_CONF's "MB" is MiB).
_SIZE_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
HEADROOM_PREFIX = "headroom="
CACHED, HEADROOM = "cached", "headroom"  # the kinds of CacheBound


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


# OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT: true/false, or the GenAI utilities' modes. vlmtrace
# puts content on spans only (it emits no GenAI events): the modes with a span capture it.
_CAPTURE_MODES = {"span_only": True, "span_and_event": True, "event_only": False, "no_content": False}


def parse_capture_content(name: str, text: str) -> bool:
    """Whether prompts and responses go on spans: a boolean, or one of the GenAI capture modes (any case)."""
    mode = _CAPTURE_MODES.get(text.strip().lower())
    if mode is not None:
        return mode
    try:
        return _parse_bool(name, text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not true/false or one of "
                         f"{', '.join(m.upper() for m in _CAPTURE_MODES)}") from None


def _parse_protocol(name: str, text: str) -> str:
    protocol = text.strip().lower()
    if protocol not in OTLP_PROTOCOLS:
        known = ", ".join(OTLP_PROTOCOLS)
        reason = "has no Python exporter" if protocol == "http/json" else "is not an OTLP protocol"
        raise ValueError(f"{name}={text!r} {reason} (vlmtrace exports with {known})")
    return protocol


def _read(environ: Mapping[str, str], names: tuple[str, ...], parse: Any, default: Any) -> Any:
    """The first of `names` that is set, parsed; None where none is set or the value is bad (warned once)."""
    for name in names:
        text = environ.get(name)
        if text is None or text.strip() == "":
            continue
        try:
            return parse(name, text.strip())
        except (TypeError, ValueError) as error:
            _log.warning("vlmtrace: %s; using the default, %s", error, default)
            return None
    return None


def _from_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    """The options set by VLMTRACE_* and OTEL_* variables; a bad value is left out (its default applies)."""
    defaults = Options()
    values: dict[str, Any] = {}

    def put(field: str, names: tuple[str, ...], parse: Any) -> None:
        value = _read(environ, names, parse, getattr(defaults, field))
        if value is not None:
            values[field] = value

    put("service_name", ("OTEL_SERVICE_NAME",), lambda name, text: text)
    put("journal", ("VLMTRACE_JOURNAL",), lambda name, text: False if text.lower() in _FALSE else text)
    for field, name, minimum in (
        ("journal_max_bytes", "VLMTRACE_JOURNAL_MAX_BYTES", 4096),
        ("journal_max_files", "VLMTRACE_JOURNAL_MAX_FILES", 1),
        ("sample_interval_ms", "VLMTRACE_SAMPLE_INTERVAL_MS", 0),
        ("otlp_max_queue_size", "OTEL_BSP_MAX_QUEUE_SIZE", 1),
        ("shutdown_timeout_ms", "VLMTRACE_SHUTDOWN_TIMEOUT_MS", 0),
        ("probe_reuse_us", "VLMTRACE_PROBE_REUSE_US", 0),
        ("trim_cache_interval_ms", "VLMTRACE_TRIM_CACHE_INTERVAL_MS", 0),
    ):
        put(field, (name,), lambda name, text, minimum=minimum: _parse_int(name, text, minimum))
    put("otlp_endpoint", ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"), lambda name, text: text)
    put("otlp_protocol", ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"), _parse_protocol)
    put("capture_content", ("VLMTRACE_CAPTURE_CONTENT", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"),
        parse_capture_content)
    for field, name in (("metrics", "VLMTRACE_METRICS"), ("journal_sync", "VLMTRACE_JOURNAL_SYNC"),
                        ("native_counters", "VLMTRACE_NATIVE_COUNTERS")):
        put(field, (name,), _parse_bool)
    put("probes", ("VLMTRACE_PROBES",), _parse_probes)
    put("devices", ("VLMTRACE_DEVICES",),
        lambda name, text: tuple(_parse_int(name, p.strip(), 0) for p in text.split(",") if p.strip()))
    put("trim_cache", ("VLMTRACE_TRIM_CACHE",), lambda name, text: CacheBound.parse(name, text) or False)
    if values.get("trim_cache") is False:
        values["trim_cache"] = None
    return values


def _parse_probes(name: str, text: str) -> tuple[str, ...]:
    probes = tuple(p.strip() for p in text.split(",") if p.strip())
    bad = [p for p in probes if p not in PROBE_NAMES]
    if bad:
        raise ValueError(f"{name}={text!r} names unknown probe(s) {', '.join(bad)} (choose from "
                         f"{', '.join(PROBE_NAMES)})")
    return probes


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
    native_counters: bool = True  # the compiled counter read (probes/native_counters.py; docs/performance.md)

    @classmethod
    def resolve(cls, overrides: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> Options:
        """Merge keyword overrides, VLMTRACE_* and OTEL_* variables.

        A bad keyword argument raises (TypeError or ValueError, naming it): the calling code is wrong. A bad
        environment value never does: it is logged once as a warning naming the variable read and the
        default used instead, so `opentelemetry-instrument` goes on loading every instrumentation.
        """
        environ = os.environ if environ is None else environ
        overrides = dict(overrides or {})
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise TypeError(f"unknown vlmtrace option(s): {', '.join(sorted(unknown))}")
        values = _from_environment(environ)
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
        if "capture_content" in overrides and not isinstance(overrides["capture_content"], bool):
            values["capture_content"] = parse_capture_content("capture_content", str(overrides["capture_content"]))
        if values.get("trim_cache") is not None and values.get("sample_interval_ms", cls.sample_interval_ms) <= 0 \
                and "trim_cache" not in overrides:
            _log.warning("vlmtrace: VLMTRACE_TRIM_CACHE=%r needs the background sampler (a sample interval above "
                         "0); using the default, off", environ.get("VLMTRACE_TRIM_CACHE", ""))
            values["trim_cache"] = None
        options = cls(**values)
        options._validate()
        return options

    def _validate(self) -> None:
        """Checks of keyword arguments (environment values were checked as they were read)."""
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
