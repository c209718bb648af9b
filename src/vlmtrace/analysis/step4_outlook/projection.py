"""How long until a device runs out: headroom on each GPU divided by how fast this workload eats it.

Headroom is the device's size minus what all processes use at the last reading. The rate is the
sum of the growing GPU components' slopes (one device), or each device's own settled
`gpu.process` slope (several devices, from the `.per_device` arrays), both read over the current growth
regime where the rate changed within the run (step3_verdict/regimes.py). Requests per second over the
trace turn requests-to-OOM into time-to-OOM.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from vlmtrace import semconv as sc
from vlmtrace.analysis.registry import GPU_COMPONENTS
from vlmtrace.analysis.robust import theil_sen
from vlmtrace.analysis.rules import MIN_POINTS_TO_FIT
from vlmtrace.analysis.step2_preparing.settle import SettledSeries
from vlmtrace.analysis.step2_preparing.tables import Tables
from vlmtrace.analysis.step3_verdict.leaks import ComponentGrowth
from vlmtrace.analysis.step3_verdict.regimes import change
from vlmtrace.analysis.step3_verdict.significance import is_significant


@dataclasses.dataclass
class DeviceOutlook:
    device: str
    total_bytes: float | None
    used_bytes: float | None
    slope_bytes_per_request: float
    requests_to_oom: float | None
    seconds_to_oom: float | None
    runs_out_first: bool = False

    @property
    def headroom_bytes(self) -> float | None:
        if self.total_bytes is None or self.used_bytes is None:
            return None
        return self.total_bytes - self.used_bytes


def request_rate(tables: Tables) -> float | None:
    """Completed requests per second over the span of the trace's requests."""
    requests = tables.requests
    if len(requests) < 2:
        return None
    seconds = (requests["end_ns"].max() - requests["start_ns"].min()) / 1e9
    return len(requests) / seconds if seconds > 0 else None


def last_finite(values: np.ndarray) -> float | None:
    finite = values[np.isfinite(values)]
    return float(finite[-1]) if len(finite) else None


def device_outlook(
    device: str, total: float | None, used: float | None, slope: float, rate: float | None
) -> DeviceOutlook:
    requests = None
    if total is not None and used is not None and slope > 0:
        requests = max(0.0, (total - used) / slope)
    seconds = float(requests / rate) if requests is not None and rate else None
    return DeviceOutlook(device, total, used, float(slope), requests, seconds)


def _rate_now(x: np.ndarray, y: np.ndarray, t_ns: np.ndarray) -> float:
    """The rate the device's memory grows at now: its current growth regime's where the rate changed within the
    run (nothing where its growth stopped), else the whole run's; 0 where it does not grow significantly."""
    known = np.isfinite(y)
    x, y, t_ns = x[known], y[known], t_ns[known]
    if len(x) < MIN_POINTS_TO_FIT:
        return 0.0
    changed = change(x, y, t_ns, 0.0)
    if changed.onset is not None:
        return changed.onset.rate.slope
    if changed.stopped is not None:
        return 0.0
    fit = theil_sen(x, y)
    return fit.slope if fit is not None and is_significant(fit, x[-1] - x[0]) else 0.0


def _per_device(tables: Tables, series: dict[int, SettledSeries], rate: float | None) -> list[DeviceOutlook]:
    devices = tables.devices.sort_values(["process", "device", "t_ns"], kind="stable")
    outlooks = []
    for device, rows in devices.groupby("device", sort=True):
        slope = 0.0
        for process, points in series.items():
            mine = rows[rows["process"] == process]
            if mine.empty:
                continue
            settled = pd.merge_asof(
                pd.DataFrame({"t_ns": points.t_ns, "x": points.x}),
                mine[["t_ns", sc.MEM_GPU_PROCESS]],
                on="t_ns",
                direction="backward",
            )
            slope += _rate_now(settled["x"].to_numpy(), settled[sc.MEM_GPU_PROCESS].to_numpy(), points.t_ns)
        latest = rows.sort_values("t_ns")
        outlooks.append(
            device_outlook(
                f"GPU {device}",
                last_finite(latest[sc.MEM_GPU_TOTAL].to_numpy()),
                last_finite(latest[sc.MEM_GPU_USED].to_numpy()) or last_finite(latest[sc.MEM_GPU_PROCESS].to_numpy()),
                slope,
                rate,
            )
        )
    return outlooks


def device_outlooks(
    tables: Tables, series: dict[int, SettledSeries], growth: list[ComponentGrowth]
) -> list[DeviceOutlook]:
    rate = request_rate(tables)
    if len(tables.devices):
        outlooks = _per_device(tables, series, rate)
    else:
        readings = tables.readings.sort_values("t_ns")
        if readings.empty or readings["gpu_total"].isna().all():
            return []
        slope = sum(item.per_request.slope for item in growth if item.grows and item.component in GPU_COMPONENTS)
        used = last_finite(readings["gpu_used"].to_numpy()) or last_finite(readings["gpu_process"].to_numpy())
        outlooks = [device_outlook("GPU", last_finite(readings["gpu_total"].to_numpy()), used, slope, rate)]
    finite = [(outlook.requests_to_oom, i) for i, outlook in enumerate(outlooks) if outlook.requests_to_oom is not None]
    if finite:
        outlooks[min(finite)[1]].runs_out_first = True
    return outlooks
