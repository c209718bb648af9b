"""What a followed journal says right now: memory per device and component, growth per request over a
sliding window with its verdict, requests to out-of-memory, what is in flight, and the last crash.

The window's verdict applies the analyzer's significance rule (`leaks.is_significant`: the 95% interval
above zero and the rise over the window worth MIN_GROWTH_BYTES and above noise) to the Theil–Sen slope
of each component's level at the last `window` request ends. It does not explain a rise (plateau,
warm-up, release) as `vlmtrace report` does: it says what the window shows, the report says why.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

from vlmtrace import semconv as sc
from vlmtrace.analysis.follow import JournalFollower
from vlmtrace.analysis.follow_records import LiveSpan, ProcessState, RequestReading
from vlmtrace.analysis.registry import BELOW_THRESHOLD, BY_NAME, COMPONENTS, NO_GROWTH
from vlmtrace.analysis.robust import Slope, theil_sen
from vlmtrace.analysis.step2_preparing.tables import RAW, derive_components
from vlmtrace.analysis.step3_verdict.significance import is_significant
from vlmtrace.analysis.step4_outlook.projection import DeviceOutlook, device_outlook, last_finite

MIN_POINTS = 5  # request ends in the window before a slope is fitted
MAX_DEVICES = 16  # devices shown per process (a sample naming more is not a real node's)
OLDEST_SHOWN = 5


@dataclasses.dataclass
class ComponentNow:
    component: str
    level: float | None  # bytes at the latest reading (all devices)
    fit: Slope | None  # per request, over the window
    klass: str | None  # registry class of the window's slope; None before MIN_POINTS request ends


@dataclasses.dataclass
class DeviceNow:
    name: str
    components: dict[str, float | None]
    outlook: DeviceOutlook


@dataclasses.dataclass
class ProcessNow:
    state: ProcessState
    window_requests: int
    devices: list[DeviceNow]
    components: list[ComponentNow]
    requests_in_flight: int
    in_flight_by_stage: dict[str, int]
    oldest_in_flight: list[LiveSpan]
    request_rate: float | None  # completed per second over the window


@dataclasses.dataclass
class LiveView:
    target: str
    running: list[ProcessNow]
    ended: list[ProcessState]
    last_ended: ProcessNow | None  # when nothing runs: the process that ended last, as it was at its end
    last_crash: ProcessState | None
    last_crash_memory: dict[str, float | None]  # each component at the crashed process's last sample
    unreadable_lines: int
    running_forgotten: int  # running processes not followed: more than the follower keeps


def _raw(readings: list[dict], device: int | None) -> dict[str, np.ndarray]:
    """The readings' raw columns (tables.RAW names), of one device's `.per_device` arrays or the scalars."""
    columns = {}
    for key, name in RAW.items():
        values = []
        for reading in readings:
            value = reading.get(key + sc.PER_DEVICE_SUFFIX) if device is not None else reading.get(key)
            if device is not None:
                value = value[device] if isinstance(value, list) and device < len(value) else None
            values.append(_number(value))
        columns[name] = np.array(values, dtype=np.float64)
    return columns


def _number(value: object) -> float:
    """A reading as a float: NaN for what is not a number (text, a boolean, an integer past a float)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            return np.nan
    return np.nan


def _device_names(reading: dict) -> list[str]:
    devices = reading.get(sc.MEM_DEVICES)
    if not isinstance(devices, list) or not devices:
        return ["GPU"]
    return [f"GPU {name}" if type(name) is int else f"GPU {str(name)[:20]}" for name in devices[:MAX_DEVICES]]


def _fit(x: np.ndarray, y: np.ndarray, min_rate: float = 0.0) -> tuple[Slope | None, bool]:
    keep = np.isfinite(y)
    if keep.sum() < MIN_POINTS:
        return None, False
    fit = theil_sen(x[keep], y[keep])
    return fit, fit is not None and is_significant(fit, float(x[keep][-1] - x[keep][0]), min_rate)


def _components(process: ProcessState, requests: list[RequestReading], x: np.ndarray) -> list[ComponentNow]:
    latest = derive_components(_raw([process.latest_sample or (requests[-1].reading if requests else {})], None))
    window = derive_components(_raw([request.reading for request in requests], None))
    result = []
    for component in COMPONENTS:
        fit, grows = _fit(x, window[component.name], component.min_leak_rate)
        klass = None
        if fit is not None:
            klass = component.leak_class if grows else (BELOW_THRESHOLD if fit.low > 0 else NO_GROWTH)
        result.append(ComponentNow(component.name, last_finite(latest[component.name]), fit, klass))
    return result


def _devices(
    process: ProcessState, requests: list[RequestReading], x: np.ndarray, rate: float | None
) -> list[DeviceNow]:
    """Each device's components now, and its outlook: headroom over this process's growth on it (NVML's
    process memory on the device, else torch's reserved) where the window shows significant growth."""
    latest = process.latest_sample or (requests[-1].reading if requests else {})
    names = _device_names(latest)
    if not any(key in latest for key in (sc.MEM_GPU_TOTAL, sc.MEM_TORCH_ALLOCATED, sc.MEM_GPU_PROCESS)):
        return []
    devices = []
    for index, name in enumerate(names):
        device = index if len(names) > 1 else None
        now_raw = _raw([latest], device)
        window_raw = _raw([request.reading for request in requests], device)
        owned = np.where(np.isfinite(window_raw["gpu_process"]), window_raw["gpu_process"], window_raw["reserved"])
        fit, grows = _fit(x, owned)
        used = last_finite(now_raw["gpu_used"]) or last_finite(now_raw["gpu_process"])
        outlook = device_outlook(
            name, last_finite(now_raw["gpu_total"]), used, fit.slope if grows and fit else 0.0, rate
        )
        components = {
            key: last_finite(values)
            for key, values in derive_components(now_raw).items()
            if key in BY_NAME and key != "host"
        }
        devices.append(DeviceNow(name, components, outlook))
    return devices


def _process_now(process: ProcessState) -> ProcessNow:
    requests = list(process.requests)
    x = np.arange(process.requests_completed - len(requests), process.requests_completed, dtype=np.float64)
    seconds = (requests[-1].end_ns - requests[0].end_ns) / 1e9 if len(requests) > 1 else 0.0
    rate = (len(requests) - 1) / seconds if seconds > 0 else None
    spans = sorted(process.in_flight.values(), key=lambda span: span.start_ns)
    by_stage = collections.Counter(span.stage or "(no stage)" for span in spans)
    return ProcessNow(
        state=process,
        window_requests=len(requests),
        devices=_devices(process, requests, x, rate),
        components=_components(process, requests, x),
        requests_in_flight=by_stage.get(sc.STAGE_REQUEST, 0),
        in_flight_by_stage=dict(by_stage.most_common()),
        oldest_in_flight=spans[:OLDEST_SHOWN],
        request_rate=rate,
    )


def live_view(follower: JournalFollower) -> LiveView:
    processes = sorted(follower.processes.values(), key=lambda p: p.first_record_ns or 0)
    crashed = [process for process in processes if process.crashed]
    last_crash = max(crashed, key=lambda p: p.last_record_ns or 0) if crashed else None
    memory = derive_components(_raw([last_crash.latest_sample], None)) if last_crash else {}
    running = [_process_now(process) for process in processes if not process.ended]
    ended = [process for process in processes if process.ended]
    return LiveView(
        target=follower.target,
        running=running,
        ended=ended,
        last_ended=_process_now(max(ended, key=lambda p: p.last_record_ns or 0)) if ended and not running else None,
        last_crash=last_crash,
        last_crash_memory={component: last_finite(values) for component, values in memory.items()},
        unreadable_lines=follower.unreadable_lines,
        running_forgotten=follower.running_forgotten,
    )
