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
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE | re.ASCII)
HEADROOM_PREFIX = "headroom="
CACHED, HEADROOM = "cached", "headroom"  # the kinds of CacheBound

# Where prompts and responses go (`capture_content`): the content capturing modes of the GenAI utilities.
NO_CONTENT, SPAN_ONLY, EVENT_ONLY, SPAN_AND_EVENT = "no_content", "span_only", "event_only", "span_and_event"
CAPTURE_MODES = (NO_CONTENT, SPAN_ONLY, EVENT_ONLY, SPAN_AND_EVENT)
GENAI_CAPTURE_VARIABLE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
# OTEL_SEMCONV_STABILITY_OPT_IN's value for the latest GenAI conventions: with it, the GenAI variable takes
# the capture modes only, as the GenAI utilities read it.
LATEST_GENAI_OPT_IN = "gen_ai_latest_experimental"

HOUR_MS = 3_600_000
# The integer options: (option, environment variable, least value, most value); docs/configuration.md.
_INTEGERS = (
    ("journal_max_bytes", "VLMTRACE_JOURNAL_MAX_BYTES", 16384, 1 << 40),  # a header is ~5 KB
    ("journal_max_files", "VLMTRACE_JOURNAL_MAX_FILES", 1, 100_000),
    ("sample_interval_ms", "VLMTRACE_SAMPLE_INTERVAL_MS", 0, HOUR_MS),
    ("otlp_max_queue_size", "OTEL_BSP_MAX_QUEUE_SIZE", 1, 10_000_000),
    ("shutdown_timeout_ms", "VLMTRACE_SHUTDOWN_TIMEOUT_MS", 0, HOUR_MS),
    ("probe_reuse_us", "VLMTRACE_PROBE_REUSE_US", 0, 1000 * HOUR_MS),
    ("trim_cache_interval_ms", "VLMTRACE_TRIM_CACHE_INTERVAL_MS", 0, 24 * HOUR_MS),
    ("capture_window_requests", "VLMTRACE_CAPTURE_WINDOW_REQUESTS", 1, 10_000_000),
    ("capture_window_seconds", "VLMTRACE_CAPTURE_WINDOW_SECONDS", 1, 24 * 3600),
    ("capture_window_bytes", "VLMTRACE_CAPTURE_WINDOW_BYTES", 1 << 20, 1 << 40),
    ("capture_every_s", "VLMTRACE_CAPTURE_EVERY_S", 0, 30 * 24 * 3600),
    ("detail_every", "VLMTRACE_DETAIL_EVERY", 1, 1_000_000),
)
MAX_SIZE = 1 << 50  # the largest size a size option takes (1 PiB)
MAX_DEVICE_INDEX = 1023
CAPTURE_MODES_ALLOCATIONS = ("auto", "off", "now")  # `capture`: when allocation sites are captured (docs/capture.md)
_BOOLEANS = (
    ("metrics", "VLMTRACE_METRICS"),
    ("journal_sync", "VLMTRACE_JOURNAL_SYNC"),
    ("native_counters", "VLMTRACE_NATIVE_COUNTERS"),
)


def is_off(text: str) -> bool:
    """Whether a setting's text turns it off: `off`, `false`, `no`, `0` (any case) or nothing."""
    return text.strip().lower() in _FALSE


def _parse_bool(name: str, text: str) -> bool:
    lowered = text.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"{name}={text!r} is not a boolean (use true/false)")


def _parse_int(name: str, text: str, minimum: int, maximum: int) -> int:
    """An integer written in ASCII digits, from `minimum` to `maximum`; ValueError naming `name` otherwise."""
    value = int(text) if re.fullmatch(r"\s*[-+]?[0-9]{1,30}\s*", text) else None
    if value is None or not minimum <= value <= maximum:
        raise ValueError(f"{name}={text[:40]!r} must be an integer from {minimum} to {maximum}")
    return value


def parse_size(name: str, text: str) -> int:
    """Bytes from "2GiB", "512 MiB", "1.5GiB" or a plain count of bytes."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise ValueError(f"{name}={text[:40]!r} is not a size (bytes, or a number with KiB, MiB, GiB or TiB)")
    size = float(match.group(1)) * _SIZE_UNITS[unit]
    if size > MAX_SIZE:  # an infinity too
        raise ValueError(f"{name}={text[:40]!r} is more than {MAX_SIZE >> 50} PiB")
    return int(size)


def parse_capture_content(name: str, text: str, modes_only: bool = False) -> str:
    """A capture mode from its name (any case) or, unless `modes_only`, a boolean: true puts content on spans."""
    mode = text.strip().lower()
    if mode in CAPTURE_MODES:
        return mode
    modes = ", ".join(m.upper() for m in CAPTURE_MODES)
    if modes_only:
        raise ValueError(
            f"{name}={text!r} is not one of {modes} (with OTEL_SEMCONV_STABILITY_OPT_IN="
            f"{LATEST_GENAI_OPT_IN}, the GenAI conventions' modes only)"
        )
    try:
        return SPAN_ONLY if _parse_bool(name, text) else NO_CONTENT
    except ValueError:
        raise ValueError(f"{name}={text!r} is not true/false or one of {modes}") from None


def latest_genai_conventions(environ: Mapping[str, str]) -> bool:
    """Whether OTEL_SEMCONV_STABILITY_OPT_IN (a comma-separated list) asks for the latest GenAI conventions."""
    chosen = environ.get("OTEL_SEMCONV_STABILITY_OPT_IN", "")
    return LATEST_GENAI_OPT_IN in {value.strip().lower() for value in chosen.split(",")}


def _parse_capture(name: str, text: str) -> str:
    mode = "off" if is_off(text) else text.strip().lower()
    if mode not in CAPTURE_MODES_ALLOCATIONS:
        raise ValueError(f"{name}={text!r} is not one of {', '.join(CAPTURE_MODES_ALLOCATIONS)}")
    return mode


def _parse_protocol(name: str, text: str) -> str:
    protocol = text.strip().lower()
    if protocol not in OTLP_PROTOCOLS:
        known = ", ".join(OTLP_PROTOCOLS)
        reason = "has no Python exporter" if protocol == "http/json" else "is not an OTLP protocol"
        raise ValueError(f"{name}={text!r} {reason} (vlmtrace exports with {known})")
    return protocol


def _parse_probes(name: str, text: str) -> tuple[str, ...]:
    probes = tuple(p.strip() for p in text.split(",") if p.strip())
    bad = [p for p in probes if p not in PROBE_NAMES]
    if bad:
        raise ValueError(
            f"{name}={text[:80]!r} names unknown probe(s) {', '.join(repr(p[:40]) for p in bad[:5])} "
            f"(choose from {', '.join(PROBE_NAMES)})"
        )
    return probes


def _parse_devices(name: str, text: str) -> tuple[int, ...]:
    return tuple(_parse_int(name, p.strip(), 0, MAX_DEVICE_INDEX) for p in text.split(",") if p.strip())


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
    put("journal", ("VLMTRACE_JOURNAL",), lambda name, text: False if is_off(text) else text)
    for field, variable, minimum, maximum in _INTEGERS:
        put(
            field,
            (variable,),
            lambda name, text, minimum=minimum, maximum=maximum: _parse_int(name, text, minimum, maximum),
        )
    put("otlp_endpoint", ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"), lambda name, text: text)
    put("otlp_protocol", ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"), _parse_protocol)
    modes_only = latest_genai_conventions(environ)
    put(
        "capture_content",
        ("VLMTRACE_CAPTURE_CONTENT", GENAI_CAPTURE_VARIABLE),
        lambda name, text: parse_capture_content(name, text, modes_only and name == GENAI_CAPTURE_VARIABLE),
    )
    for field, variable in _BOOLEANS:
        put(field, (variable,), _parse_bool)
    put("capture", ("VLMTRACE_CAPTURE",), _parse_capture)
    put("probes", ("VLMTRACE_PROBES",), _parse_probes)
    put("devices", ("VLMTRACE_DEVICES",), _parse_devices)
    put("trim_cache", ("VLMTRACE_TRIM_CACHE",), lambda name, text: CacheBound.parse(name, text) or False)
    for field in ("journal", "trim_cache"):  # turned off by its variable
        if values.get(field) is False:
            values[field] = None
    return values


def _keyword(name: str, value: Any) -> Any:
    """One keyword argument, in its option's form; TypeError or ValueError naming it where it cannot be used."""
    if name == "journal":
        if value is None or value is False:
            return None
        if not isinstance(value, (str, os.PathLike)):
            raise TypeError(f"journal={value!r} is not a path (or off)")
        return None if isinstance(value, str) and is_off(value) else os.fspath(value)
    if name == "capture_content":
        if isinstance(value, bool):
            return SPAN_ONLY if value else NO_CONTENT
        return parse_capture_content(name, str(value))
    if name == "trim_cache":
        return CacheBound.parse(name, value)
    if name == "capture":
        return _parse_capture(name, "off" if value is False else str(value))
    if name in ("probes", "devices"):
        if value is None and name == "devices":
            return None
        if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
            raise TypeError(f"{name}={value!r} is not a list")
        parse = _parse_probes if name == "probes" else _parse_devices
        return parse(name, ",".join(str(item) for item in value))
    bounds = next(((least, most) for field, _, least, most in _INTEGERS if field == name), None)
    if bounds is not None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name}={value!r} is not an integer")
        if not bounds[0] <= value <= bounds[1]:
            shown = value if abs(value) < 10**30 else "a number that large"
            raise ValueError(f"{name}={shown} must be an integer from {bounds[0]} to {bounds[1]}")
        return value
    if name in (field for field, _ in _BOOLEANS):
        if not isinstance(value, bool):
            raise TypeError(f"{name}={value!r} is not a boolean (use True/False)")
        return value
    if name == "otlp_protocol":
        return _parse_protocol(name, str(value))
    if not (isinstance(value, str) or (value is None and name == "otlp_endpoint")):
        raise TypeError(f"{name}={value!r} is not a string")
    return value


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
            if is_off(text):
                return None
            headroom = text.lower().startswith(HEADROOM_PREFIX)
            kind = HEADROOM if headroom else CACHED
            limit = parse_size(
                f"{name} headroom" if headroom else name, text[len(HEADROOM_PREFIX) :] if headroom else text
            )
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
    # 32 MiB: ~120,000 records of format 3, which the report reads in columns (readers/journal_columns.py)
    journal_max_bytes: int = 32 * 1024 * 1024
    journal_max_files: int = 8
    journal_sync: bool = False
    sample_interval_ms: int = 100
    otlp_endpoint: str | None = None
    otlp_protocol: str = "http/protobuf"
    otlp_max_queue_size: int = 2048
    shutdown_timeout_ms: int = 2000
    capture_content: str = NO_CONTENT  # one of CAPTURE_MODES
    probes: tuple[str, ...] = PROBE_NAMES
    devices: tuple[int, ...] | None = None
    probe_reuse_us: int = 200
    metrics: bool = True
    trim_cache: CacheBound | None = None
    trim_cache_interval_ms: int = 5000
    native_counters: bool = True  # the compiled counter read (probes/native_counters.py; docs/performance.md)
    capture: str = "auto"  # allocation sites: one of CAPTURE_MODES_ALLOCATIONS (docs/capture.md)
    capture_window_requests: int = 64
    capture_window_seconds: int = 300
    capture_window_bytes: int = 512 << 20
    capture_every_s: int = 3600
    # Stage detail on 1 request in this many once the process is past its young requests and no growth is
    # suspected (instrumentation/detail.py; docs/configuration.md); 1: every request.
    detail_every: int = 1

    @property
    def content_on_spans(self) -> bool:
        """Prompts and responses go on the request span (`gen_ai.input.messages`, `gen_ai.output.messages`)."""
        return self.capture_content in (SPAN_ONLY, SPAN_AND_EVENT)

    @property
    def content_in_events(self) -> bool:
        """Prompts and responses go in a `gen_ai.client.inference.operation.details` event (the Logs API)."""
        return self.capture_content in (EVENT_ONLY, SPAN_AND_EVENT)

    @classmethod
    def resolve(
        cls, overrides: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None, strict: bool = False
    ) -> Options:
        """Merge keyword overrides, VLMTRACE_* and OTEL_* variables.

        No value stops instrumentation (`opentelemetry-instrument` goes on loading every instrumentation, the
        application goes on starting): an unknown keyword, or a value that cannot be used, a keyword's or a
        variable's, is one warning naming it and the value used instead. `strict`: a keyword that cannot be
        used raises instead (TypeError or ValueError naming it), for a command line checking its arguments.
        """
        environ = os.environ if environ is None else environ
        overrides = dict(overrides or {})
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - fields)
        if unknown:
            if strict:
                raise TypeError(f"unknown option(s) {', '.join(unknown)}")
            _log.warning(
                "vlmtrace: unknown option(s) %s, ignored (the options: vlmtrace.config.Options)", ", ".join(unknown)
            )
        values = _from_environment(environ)
        for name, value in overrides.items():
            if name not in fields:
                continue
            try:
                values[name] = _keyword(name, value)
            except (TypeError, ValueError) as error:
                if strict:
                    raise
                _log.warning("vlmtrace: %s; keeping %s=%r", error, name, values.get(name, getattr(cls, name)))
        if values.get("trim_cache") is not None and values.get("sample_interval_ms", cls.sample_interval_ms) <= 0:
            given = (
                f"trim_cache={overrides['trim_cache']!r}"
                if "trim_cache" in overrides
                else f"VLMTRACE_TRIM_CACHE={environ.get('VLMTRACE_TRIM_CACHE', '')!r}"
            )
            problem = (
                f"{given} needs the background sampler (a sample interval above 0: sample_interval_ms, "
                "VLMTRACE_SAMPLE_INTERVAL_MS)"
            )
            if strict and "trim_cache" in overrides:
                raise ValueError(problem)
            _log.warning("vlmtrace: %s; using the default, off", problem)
            values["trim_cache"] = None
        return cls(**values)

    def describe(self) -> dict[str, Any]:
        described = dataclasses.asdict(self)
        described["trim_cache"] = str(self.trim_cache) if self.trim_cache is not None else None
        return described
