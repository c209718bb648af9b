"""The diff page: two runs compared, one self-contained HTML file built like the report (plotly inlined,
the same escaping and Content-Security-Policy: report/html.py says why)."""

from __future__ import annotations

import datetime
import secrets
from pathlib import Path

import plotly.offline

from vlmtrace import __version__
from vlmtrace.analysis import CLASS_NAMES, COMPONENT_NAMES, MIN_GROWTH_BYTES, Comparison, headline
from vlmtrace.report import figures
from vlmtrace.report.diff_text import NO_FITS, verdict_line
from vlmtrace.report.html import environment, figure_json, utc_time
from vlmtrace.report.output import replace_file


def render_diff(comparison: Comparison) -> str:
    figure = figures.comparison_figure(comparison)
    runs = {"before": comparison.before.summary, "after": comparison.after.summary}
    return (
        environment()
        .get_template("diff.html.j2")
        .render(
            nonce=secrets.token_urlsafe(16),
            plotly_js=plotly.offline.get_plotlyjs(),
            chart=figure_json(figure) if figure is not None else None,
            comparison=comparison,
            lines=[verdict_line(change) for change in comparison.changes if change.verdict != "unchanged"]
            or ([] if comparison.changes else [NO_FITS]),
            runs=runs,
            headlines={name: headline(summary)[0] for name, summary in runs.items()},
            component_names=COMPONENT_NAMES,
            class_names=CLASS_NAMES,
            min_growth_bytes=MIN_GROWTH_BYTES,
            generated=utc_time(int(datetime.datetime.now(tz=datetime.timezone.utc).timestamp() * 1e9)),
            version=__version__,
        )
    )


def write_diff(comparison: Comparison, path: str | Path) -> None:
    replace_file(path, render_diff(comparison))
