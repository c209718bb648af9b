"""The timeline chart of one process: GPU memory by component, host memory and the heap, which stages
had spans open when, the cache guard's trims and where the journal stopped; reduced to a few thousand
points whatever the trace's size.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from vlmtrace import semconv as sc
from vlmtrace.analysis import COMPONENT_NAMES, MISSING_TIME, Analysis, cache_trims
from vlmtrace.report.figure_style import COLORS, MiB, label_text, spread, styled

TIMELINE_BINS = 1500
MIN_TIMELINE_READINGS = 3
STRIP_STAGES = 12
ZOOM_MARGIN_PARTS = 30  # the margin around the requests' window: a thirtieth of it on each side
HEAP_LINE = "host heap in use (heap counter)"


def _envelope(readings: pd.DataFrame, bins: int) -> pd.DataFrame:
    """At most 2 readings per time bin (its lowest and highest GPU total), so peaks and floors survive."""
    if len(readings) <= 2 * bins:
        return readings
    times = readings["t_ns"].to_numpy()
    edges = np.linspace(times[0], times[-1], bins + 1)
    which = np.clip(np.searchsorted(edges, times, "right") - 1, 0, bins - 1)
    total = readings[["tensor", "cache", "native"]].fillna(0).sum(axis=1).to_numpy()
    frame = pd.DataFrame({"bin": which, "total": total, "row": np.arange(len(times))})
    grouped = frame.groupby("bin")["total"]
    keep = np.union1d(frame.loc[grouped.idxmax(), "row"].to_numpy(), frame.loc[grouped.idxmin(), "row"].to_numpy())
    return readings.iloc[keep]


def _coverage(spans: pd.DataFrame, edges: np.ndarray) -> pd.DataFrame:
    """Share of each time bin during which at least one span of each stage was open."""
    rows = {}
    widths = np.diff(edges)
    codes, stages = pd.factorize(spans["stage"].astype(object).fillna("(no stage)").to_numpy())
    starts_all = spans["start_ns"].to_numpy().astype(np.float64)
    ends_all = spans["end_ns"].to_numpy().astype(np.float64)
    for code, stage in enumerate(stages):
        mine = codes == code
        order = np.argsort(starts_all[mine], kind="stable")
        starts = starts_all[mine][order]
        ends = np.maximum.accumulate(ends_all[mine][order])
        fresh = np.concatenate([[True], starts[1:] > ends[:-1]])
        last = np.concatenate([fresh[1:], [True]])
        merged_start, merged_end = starts[fresh], ends[last]
        lengths = merged_end - merged_start
        cumulative = np.concatenate([[0.0], np.cumsum(lengths)])
        index = np.searchsorted(merged_start, edges, "right") - 1
        inside = np.clip(edges - merged_start[np.maximum(index, 0)], 0, lengths[np.maximum(index, 0)])
        covered = np.where(index >= 0, cumulative[np.maximum(index, 0)] + inside, 0.0)
        rows[str(stage)] = np.diff(covered) / widths
    frame = pd.DataFrame(rows).T
    return frame.loc[frame.sum(axis=1).sort_values(ascending=False).index[:STRIP_STAGES]]


def timeline_figure(analysis: Analysis, process: int) -> go.Figure | None:
    readings = analysis.tables.readings
    readings = readings[readings["process"] == process]
    measured = np.isfinite(readings[["tensor", "cache", "native", "host"]].to_numpy()).any(axis=1)
    if measured.sum() < MIN_TIMELINE_READINGS:
        return None
    points = _envelope(readings, TIMELINE_BINS)
    times = pd.to_datetime(points["t_ns"].to_numpy(), unit="ns")
    figure = make_subplots(rows=3, cols=1, shared_xaxes=True, row_heights=[0.55, 0.2, 0.25], vertical_spacing=0.04)
    for component in ("tensor", "cache", "native"):
        values = points[component].to_numpy() / MiB
        if np.isfinite(values).any():
            figure.add_trace(
                go.Scatter(
                    x=times,
                    y=values,
                    name=COMPONENT_NAMES[component],
                    stackgroup="gpu",
                    mode="lines",
                    line=dict(width=0.5, color=COLORS[component]),
                    hovertemplate="%{y:,.1f} MiB<extra>" + label_text(COMPONENT_NAMES[component]) + "</extra>",
                ),
                row=1,
                col=1,
            )
    host = points["host"].to_numpy() / MiB
    if np.isfinite(host).any():
        figure.add_trace(
            go.Scatter(
                x=times, y=host, name=COMPONENT_NAMES["host"], mode="lines", line=dict(color=COLORS["host"], width=1)
            ),
            row=2,
            col=1,
        )
    heap = points["heap"].to_numpy() / MiB  # NaN throughout where the process ran without the heap counter
    if np.isfinite(heap).any():  # a process started with the heap counter (vlmtrace run --heap-counter)
        figure.add_trace(
            go.Scatter(
                x=times, y=heap, name=HEAP_LINE, mode="lines", line=dict(color=COLORS["host"], width=1, dash="dot")
            ),
            row=2,
            col=1,
        )
    spans = analysis.tables.spans
    spans = spans[(spans["start_ns"] != MISSING_TIME) & (spans["end_ns"] != MISSING_TIME)]
    mine = spans[spans["process"] == process]
    spans = mine if len(mine) else spans
    first, last = int(readings["t_ns"].iloc[0]), int(readings["t_ns"].iloc[-1])
    if len(spans) and last > first:
        edges = np.linspace(first, last, TIMELINE_BINS + 1)
        coverage = _coverage(spans, edges)
        centers = pd.to_datetime(((edges[:-1] + edges[1:]) / 2).astype(np.int64), unit="ns")
        figure.add_trace(
            go.Heatmap(
                x=centers,
                y=[label_text(stage, 24) for stage in coverage.index],
                z=coverage.to_numpy(),
                colorscale=[[0, "#ffffff"], [1, "#4c6ef5"]],
                zmin=0,
                zmax=1,
                showscale=False,
                hovertemplate="%{y}: open %{z:.0%} of the time<extra></extra>",
            ),
            row=3,
            col=1,
        )
    _mark_trims(figure, analysis, process, readings)
    styled(figure, 620)
    figure.update_yaxes(title_text="GPU MiB", row=1, col=1)
    figure.update_yaxes(title_text="host MiB", row=2, col=1)
    figure.update_yaxes(title_text="stage", row=3, col=1, autorange="reversed")
    stopped = next(
        (item.last_record_ns for item in analysis.crashed if item.process == analysis.data.processes[process].label),
        None,
    )
    _zoom_to_requests(figure, analysis.tables.requests, stopped)
    if stopped is not None:
        # A line through all three rows where the journal ends, labelled: the crash is the chart's subject.
        figure.add_vline(x=_moment(stopped), line=dict(color="#b42318", width=2, dash="dot"))
        figure.add_annotation(
            x=_moment(stopped),
            y=1,
            xref="x",
            yref="paper",
            text="process stopped",
            showarrow=False,
            xanchor="right",
            yanchor="bottom",
            font=dict(color="#b42318"),
            name="crash-marker",
        )
    return figure


def _mark_trims(figure: go.Figure, analysis: Analysis, process: int, readings: pd.DataFrame) -> None:
    """The cache guard's trims as markers on the GPU memory, at the level the memory had just before each."""
    trims = cache_trims(analysis.tables)
    trims = trims[(trims["process"] == process) & (trims["start_ns"] != MISSING_TIME)].sort_values("start_ns")
    if trims.empty:
        return
    trims = trims.iloc[spread(len(trims))]
    starts = trims["start_ns"].to_numpy()
    level = readings[["tensor", "cache", "native"]].fillna(0).sum(axis=1).to_numpy() / MiB
    before = np.clip(np.searchsorted(readings["t_ns"].to_numpy(), starts, "right") - 1, 0, len(readings) - 1)
    released = -trims[sc.MEM_TORCH_RESERVED + sc.DELTA_SUFFIX].to_numpy() / MiB
    figure.add_trace(
        go.Scatter(
            x=pd.to_datetime(starts, unit="ns"),
            y=level[before],
            name="cache trims",
            mode="markers",
            marker=dict(symbol="triangle-down", size=9, color="#7a2e00"),
            customdata=np.column_stack([released, trims["duration_s"].to_numpy() * 1000]),
            hovertemplate="cache trim: %{customdata[0]:,.1f} MiB released in %{customdata[1]:.1f} ms<extra></extra>",
        ),
        row=1,
        col=1,
    )


def _zoom_to_requests(figure: go.Figure, requests: pd.DataFrame, stopped: int | None) -> None:
    """Open the chart on the requests (and the crash), not on model loading before them: the whole
    run stays one double-click away."""
    if requests.empty:
        return
    start, end = int(requests["start_ns"].min()), int(requests["end_ns"].max())
    if stopped is not None:
        end = max(end, stopped)
    margin = max((end - start) // ZOOM_MARGIN_PARTS, 10**6)
    figure.update_xaxes(range=[_moment(start - margin), _moment(end + margin)])


def _moment(nanos: int) -> pd.Timestamp:
    """A time for a single layout value, in whole microseconds (what plotly keeps of a Timestamp)."""
    return pd.Timestamp(nanos // 1000 * 1000, unit="ns")
