"""The look every chart of the report shares: a plain white layout set directly, the components' colours,
and the two reductions every figure makes: trace strings as escaped label text, and at most MAX_POINTS
points per scatter trace.

Every string that came from a trace (stage names, process labels) is HTML-escaped before it goes into
a figure: plotly renders a subset of HTML in labels, and a stage name must stay a name.
"""

from __future__ import annotations

import html

import numpy as np
import plotly.graph_objects as go

MiB = float(1 << 20)
MAX_POINTS = 2000  # per scatter trace: beyond this a chart shows nothing more, only weighs more
COLORS = {"tensor": "#d62728", "cache": "#ff7f0e", "native": "#1f77b4", "host": "#2ca02c"}
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


def styled(figure: go.Figure, height: int) -> go.Figure:
    figure.update_layout(**LAYOUT, height=height)
    figure.update_xaxes(**AXES)
    figure.update_yaxes(**AXES)
    return figure


def label_text(text: object, limit: int = 60) -> str:
    """A trace string as plotly label text: cut to `limit` characters, then HTML-escaped."""
    text = str(text)
    return html.escape(text if len(text) <= limit else text[: limit - 1] + "…", quote=True)


def spread(count: int, limit: int = MAX_POINTS) -> np.ndarray:
    """Indices of at most `limit` points spread evenly over `count`, first and last included."""
    if count <= limit:
        return np.arange(count)
    return np.unique(np.linspace(0, count - 1, limit).round().astype(np.int64))
