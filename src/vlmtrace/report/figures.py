"""The report's charts as plotly figures, reduced to a few thousand points whatever the trace's size.

Every string that came from a trace (stage names, process labels) is HTML-escaped before it goes into
a figure: plotly renders a subset of HTML in labels, and a stage name must stay a name.
"""

from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from vlmtrace import semconv as sc
from vlmtrace.analysis import (
    COMPONENT_NAMES,
    HEAP_STAGES,
    MISSING_TIME,
    Analysis,
    Comparison,
    ComponentGrowth,
    ProcessInfo,
    Verdict,
    allocated_where,
    cache_trims,
    charged_levels,
    kept_curve,
)

MiB = float(1 << 20)
TIMELINE_BINS = 1500
MIN_TIMELINE_READINGS = 3
MAX_POINTS = 2000  # per scatter trace: beyond this a chart shows nothing more, only weighs more
STRIP_STAGES = 12
ZOOM_MARGIN_PARTS = 30  # the margin around the requests' window: a thirtieth of it on each side
COLORS = {"tensor": "#d62728", "cache": "#ff7f0e", "native": "#1f77b4", "host": "#2ca02c"}
HEAP_LINE = "host heap in use (heap counter)"
BEFORE_COLOR = "#868e96"  # the run compared against, in grey under the after run's component colour
# A plain white look set directly: plotly's templates are copied into every figure (slow, and heavy in the page).
LAYOUT = dict(
    template=None,
    paper_bgcolor="white",
    plot_bgcolor="white",
    margin=dict(l=70, r=30, t=50, b=50),
    legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0),
    font=dict(family="system-ui, -apple-system, Segoe UI, sans-serif", size=12, color="#2a3f5f"),
    hoverlabel=dict(align="left"),
)
AXES = dict(gridcolor="#ebf0f8", linecolor="#ebf0f8", zerolinecolor="#ebf0f8", automargin=True)


def process_in_words(info: ProcessInfo) -> str:
    """A process as a reader knows it, `process 804 on host vm`, where its label (`vm:804`) is the journal's key."""
    if info.pid is None:
        return info.label
    return f"process {info.pid} on host {info.host}" if info.host else f"process {info.pid}"


def _style(figure: go.Figure, height: int) -> go.Figure:
    figure.update_layout(**LAYOUT, height=height)
    figure.update_xaxes(**AXES)
    figure.update_yaxes(**AXES)
    return figure


def _label(text: object, limit: int = 60) -> str:
    """A trace string as plotly label text: cut to `limit` characters, then HTML-escaped."""
    text = str(text)
    return html.escape(text if len(text) <= limit else text[: limit - 1] + "…", quote=True)


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


def _every(count: int, limit: int = MAX_POINTS) -> np.ndarray:
    """Indices of at most `limit` points spread evenly over `count`, first and last included."""
    if count <= limit:
        return np.arange(count)
    return np.unique(np.linspace(0, count - 1, limit).round().astype(np.int64))


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
                    hovertemplate="%{y:,.1f} MiB<extra>" + _label(COMPONENT_NAMES[component]) + "</extra>",
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
                y=[_label(stage, 24) for stage in coverage.index],
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
    _style(figure, 620)
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
    trims = trims.iloc[_every(len(trims))]
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


def growth_figure(analysis: Analysis) -> go.Figure | None:
    if not analysis.growth:
        return None
    figure = go.Figure()
    several = len({item.process for item in analysis.growth}) > 1
    for item in analysis.growth:
        name = COMPONENT_NAMES[item.component]
        if several:
            name += f" — {process_in_words(analysis.data.processes[item.process])}"
        base = item.y[0]
        shown = _every(len(item.x))
        figure.add_trace(
            go.Scatter(
                x=item.x[shown],
                y=(item.y[shown] - base) / MiB,
                name=_label(name),
                mode="lines+markers",
                marker=dict(size=4),
                line=dict(color=COLORS[item.component], width=1),
                hovertemplate="after %{x:,.0f} requests: %{y:+,.1f} MiB<extra></extra>",
            )
        )
        if item.grows:
            fit = item.per_request
            xs = np.array([item.x[item.first_point], item.x[-1]])
            figure.add_trace(
                go.Scatter(
                    x=xs,
                    y=(fit.intercept + fit.slope * xs - base) / MiB,
                    mode="lines",
                    showlegend=False,
                    line=dict(color=COLORS[item.component], dash="dash", width=2),
                    hovertemplate=f"fit: {fit.slope / MiB:+.2f} MiB per request<extra></extra>",
                )
            )
        for line in (_allocating_stage_chunks(analysis, item), _kept_by_birth(analysis, item)):
            if line is not None:
                figure.add_trace(line)
    _style(figure, 420)
    figure.update_xaxes(title_text="requests completed")
    figure.update_yaxes(title_text="MiB")
    return figure


def _verdict_of(analysis: Analysis, item: ComponentGrowth) -> Verdict | None:
    """The verdict that reads `item` (its process and component)."""
    label = analysis.data.processes[item.process].label
    return next((v for v in analysis.summary.verdicts if v.process == label and v.component == item.component), None)


def _allocating_stage_chunks(analysis: Analysis, item: ComponentGrowth) -> go.Scatter | None:
    """Where a host leak's rate is its allocating stage's large chunks (heap_tags.from_allocations), those
    chunks after each request, from where they began: the line the rate was read from, beside the resident
    levels that also hold the work in flight."""
    verdict = _verdict_of(analysis, item)
    if verdict is None or "slope_from_allocations" not in verdict.evidence:
        return None
    stage = verdict.evidence["allocating_stage"]
    samples = analysis.tables.heap_by_stage
    levels = charged_levels(samples[samples["process"] == item.process], analysis.series[item.process], stage)
    known = np.isfinite(levels)
    x, levels = analysis.series[item.process].x[known], levels[known]
    shown = _every(len(x))
    return go.Scatter(
        x=x[shown],
        y=(levels[shown] - levels[0]) / MiB,
        name=_label(f"large heap chunks allocated {allocated_where(stage)}"),
        mode="lines",
        line=dict(color=COLORS[item.component], width=1, dash="dot"),
        hovertemplate="after %{x:,.0f} requests: %{y:+,.1f} MiB<extra></extra>",
    )


def _kept_by_birth(analysis: Analysis, item: ComponentGrowth) -> go.Scatter | None:
    """Where a host leak was called or read by what its stage kept (survivors.py), what that stage still held at
    the end of the run of what it allocated up to each point: the straight line a leak draws, beside the resident
    levels that also hold the work in flight and the working sets."""
    verdict = _verdict_of(analysis, item)
    survivors = analysis.tables.heap_survivors.get(item.process)
    if verdict is None or survivors is None or "survivors_stage" not in verdict.evidence:
        return None
    stage = verdict.evidence["survivors_stage"]
    requests = analysis.tables.requests
    x, kept = kept_curve(HEAP_STAGES.index(stage), survivors, requests[requests["process"] == item.process])
    shown = _every(len(x))
    return go.Scatter(
        x=x[shown],
        y=kept[shown] / MiB,
        name=_label(f"still held, allocated {allocated_where(stage)} by then"),
        mode="lines",
        line=dict(color=COLORS[item.component], width=2, dash="dashdot"),
        hovertemplate="allocated by request %{x:,.0f} and still held: %{y:,.1f} MiB<extra></extra>",
    )


def primary_growth(analysis: Analysis) -> ComponentGrowth | None:
    """The component the input-feature plot is about: the fastest grower, else the largest plateau."""
    growing = [item for item in analysis.growth if item.grows]
    if growing:
        return max(growing, key=lambda item: item.per_request.slope)
    plateaus = [item for item in analysis.growth if item.plateau]
    return max(plateaus, key=lambda item: item.growth_bytes) if plateaus else None


def feature_figure(analysis: Analysis) -> go.Figure | None:
    item = primary_growth(analysis)
    if item is None:
        return None
    retained = np.diff(item.y) / MiB
    shown = _every(len(retained))
    panels = [
        (column, title, scale)
        for column, title, scale in (
            ("image_pixels_sum", "image megapixels", 1e6),
            ("images_sum", "images", 1.0),
            ("input_tokens_sum", "input tokens", 1.0),
        )
        if column in item.features and item.features[column].nunique() > 1
    ]
    if not panels:
        return None
    figure = make_subplots(rows=1, cols=len(panels), shared_yaxes=True, horizontal_spacing=0.05)
    for index, (column, title, scale) in enumerate(panels, start=1):
        values = item.features[column].to_numpy(dtype=np.float64)[1:] / scale
        figure.add_trace(
            go.Scatter(
                x=values[shown],
                y=retained[shown],
                mode="markers",
                marker=dict(size=5, color=COLORS[item.component], opacity=0.6),
                showlegend=False,
                hovertemplate=f"%{{x:,.2f}} {title}: %{{y:+,.2f}} MiB<extra></extra>",
            ),
            row=1,
            col=index,
        )
        figure.update_xaxes(title_text=title, row=1, col=index)
    figure.update_yaxes(title_text=f"retained MiB ({item.component})", row=1, col=1)
    _style(figure, 360)
    return figure


def comparison_figure(comparison: Comparison) -> go.Figure | None:
    """Each component's settled level in both runs on one axis of requests completed, one row per
    component, each run with its fitted slope (dashed): the change the verdict is about, drawn."""
    rows = [change for change in comparison.changes if change.before or change.after]
    if not rows:
        return None
    titles = [f"{_label(COMPONENT_NAMES[change.component])} — {change.verdict}" for change in rows]
    figure = make_subplots(
        rows=len(rows), cols=1, shared_xaxes=True, subplot_titles=titles, vertical_spacing=0.08 / max(len(rows) - 1, 1)
    )
    for index, change in enumerate(rows, start=1):
        for run, side, color in (
            ("before", change.before, BEFORE_COLOR),
            ("after", change.after, COLORS[change.component]),
        ):
            if side is None:
                continue
            item = side.growth
            base = item.y[0]
            shown = _every(len(item.x))
            figure.add_trace(
                go.Scatter(
                    x=item.x[shown],
                    y=(item.y[shown] - base) / MiB,
                    name=run,
                    legendgroup=run,
                    showlegend=index == 1,
                    mode="lines+markers",
                    marker=dict(size=3, color=color),
                    line=dict(color=color, width=1),
                    hovertemplate=f"{run}, after %{{x:,.0f}} requests: %{{y:+,.1f}} MiB<extra></extra>",
                ),
                row=index,
                col=1,
            )
            xs = np.array([item.x[item.first_point], item.x[-1]])
            fit = item.per_request
            figure.add_trace(
                go.Scatter(
                    x=xs,
                    y=(fit.intercept + fit.slope * xs - base) / MiB,
                    mode="lines",
                    showlegend=False,
                    legendgroup=run,
                    line=dict(color=color, dash="dash", width=2),
                    hovertemplate=f"{run} fit: {fit.slope / MiB:+.3f} MiB per request<extra></extra>",
                ),
                row=index,
                col=1,
            )
        figure.update_yaxes(title_text="MiB", row=index, col=1)
    _style(figure, 140 + 220 * len(rows))
    figure.update_xaxes(title_text="requests completed", row=len(rows), col=1)
    return figure
