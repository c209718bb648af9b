"""The report's growth charts as plotly figures: each component's settled level per request completed with
its fit, the retained bytes against the inputs, and two runs compared; reduced to a few thousand points
whatever the trace's size. The timeline is timeline_figure.py's; the look they share, figure_style.py's.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from vlmtrace.analysis import (
    COMPONENT_NAMES,
    HEAP_STAGES,
    Analysis,
    Comparison,
    ComponentGrowth,
    ProcessInfo,
    Verdict,
    allocated_where,
    charged_levels,
    kept_curve,
)
from vlmtrace.report.figure_style import COLORS, MiB, label_text, spread, styled

BEFORE_COLOR = "#868e96"  # the run compared against, in grey under the after run's component colour


def process_in_words(info: ProcessInfo) -> str:
    """A process as a reader knows it, `process 804 on host vm`, where its label (`vm:804`) is the journal's key."""
    if info.pid is None:
        return info.label
    return f"process {info.pid} on host {info.host}" if info.host else f"process {info.pid}"


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
        shown = spread(len(item.x))
        figure.add_trace(
            go.Scatter(
                x=item.x[shown],
                y=(item.y[shown] - base) / MiB,
                name=label_text(name),
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
    styled(figure, 420)
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
    shown = spread(len(x))
    return go.Scatter(
        x=x[shown],
        y=(levels[shown] - levels[0]) / MiB,
        name=label_text(f"large heap chunks allocated {allocated_where(stage)}"),
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
    shown = spread(len(x))
    return go.Scatter(
        x=x[shown],
        y=kept[shown] / MiB,
        name=label_text(f"still held, allocated {allocated_where(stage)} by then"),
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
    shown = spread(len(retained))
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
    styled(figure, 360)
    return figure


def comparison_figure(comparison: Comparison) -> go.Figure | None:
    """Each component's settled level in both runs on one axis of requests completed, one row per
    component, each run with its fitted slope (dashed): the change the verdict is about, drawn."""
    rows = [change for change in comparison.changes if change.before or change.after]
    if not rows:
        return None
    titles = [f"{label_text(COMPONENT_NAMES[change.component])} — {change.verdict}" for change in rows]
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
            shown = spread(len(item.x))
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
    styled(figure, 140 + 220 * len(rows))
    figure.update_xaxes(title_text="requests completed", row=len(rows), col=1)
    return figure
