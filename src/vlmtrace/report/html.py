"""The HTML report: one self-contained file (plotly.js inlined) that opens offline, verdict first.

jinja2 autoescaping covers every string from a trace that lands in the page; figure data travels as
JSON in `<script type="application/json">` with `<` escaped, and a Content-Security-Policy with a
per-report nonce keeps any script but the report's own from running, and the page from loading anything.
"""

from __future__ import annotations

import datetime
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

import jinja2
import plotly.offline

from vlmtrace import __version__
from vlmtrace.analysis import (
    CLASS_NAMES,
    COMPONENT_NAMES,
    Analysis,
    bounded_attributes,
    crash_advice,
    format_bytes,
    format_count,
    format_seconds,
    headline,
    is_leak,
    plateau_sentence,
    stage_is_uncertain,
)
from vlmtrace.report import figures, timeline_figure
from vlmtrace.report.decided import decided_in_words
from vlmtrace.report.output import replace_file

if TYPE_CHECKING:
    import plotly.graph_objects as go

TEMPLATES = Path(__file__).parent / "templates"
MAX_ATTRIBUTE_CHARS = 300


def utc_time(nanos: int | None) -> str:
    if nanos is None:
        return "n/a"
    when = datetime.datetime.fromtimestamp(nanos / 1e9, tz=datetime.timezone.utc)
    return when.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _short(value: object) -> str:
    text = str(value)
    return text if len(text) <= MAX_ATTRIBUTE_CHARS else text[:MAX_ATTRIBUTE_CHARS] + "…"


def environment() -> jinja2.Environment:
    """The report templates' environment, shared by the report and the diff page."""
    templates = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    templates.filters.update(
        bytes=format_bytes,
        signed_bytes=lambda value: format_bytes(value, signed=True),
        seconds=format_seconds,
        count=format_count,
        time=utc_time,
        short=_short,
        bounded=bounded_attributes,
        percent=lambda value: "n/a" if value is None else f"{value:.0%}",
    )
    return templates


def figure_json(figure: go.Figure) -> str:
    return figure.to_json().replace("<", "\\u003c")


def _primary_process(analysis: Analysis) -> int | None:
    readings = analysis.tables.readings
    if readings.empty:
        return None
    return int(readings["process"].value_counts().idxmax())


def _stage_tables(analysis: Analysis) -> list[dict]:
    """Stage tables for the components that grow or plateau: the others retain only noise."""
    rows = analysis.summary.stages
    shown = {v.component for v in analysis.summary.verdicts if v.klass != "no_growth" or v.plateau}
    tables = []
    for component in ("tensor", "cache", "native", "host"):
        mine = [
            row
            for row in rows
            if row["component"] == component and component in shown and abs(row["retained_bytes"]) > 0
        ]
        if mine:
            tables.append({"component": COMPONENT_NAMES[component], "rows": mine})
    return tables


def render_report(analysis: Analysis) -> str:
    summary = analysis.summary
    process = _primary_process(analysis)
    charts = []
    for chart_id, figure in (
        ("timeline", timeline_figure.timeline_figure(analysis, process) if process is not None else None),
        ("growth", figures.growth_figure(analysis)),
        ("features", figures.feature_figure(analysis)),
    ):
        if figure is not None:
            charts.append({"id": chart_id, "json": figure_json(figure)})
    nonce = secrets.token_urlsafe(16)
    template = environment().get_template("report.html.j2")
    return template.render(
        nonce=nonce,
        plotly_js=plotly.offline.get_plotlyjs(),
        charts={chart["id"]: chart for chart in charts},
        summary=summary,
        process_label=figures.process_in_words(analysis.data.processes[process]) if process is not None else None,
        process_words={info.label: figures.process_in_words(info) for info in analysis.data.processes},
        several_processes=len({v.process for v in summary.verdicts}) > 1,
        primary=figures.primary_growth(analysis),
        headline=headline(summary),
        plateaus=[plateau_sentence(v) for v in summary.verdicts if v.plateau],
        component_names=COMPONENT_NAMES,
        uncertain=stage_is_uncertain,
        decided_in_words=decided_in_words,
        class_names=CLASS_NAMES,
        is_leak=is_leak,
        stage_tables=_stage_tables(analysis),
        crashed=analysis.crashed,
        crash_advice=[(item.process, crash_advice(item)) for item in analysis.crashed],
        errors=[p for p in summary.problems if p["severity"] == "error"],
        notes=[p for p in summary.problems if p["severity"] != "error"],
        generated=utc_time(int(datetime.datetime.now(tz=datetime.timezone.utc).timestamp() * 1e9)),
        version=__version__,
        first_request_ns=int(analysis.tables.requests["start_ns"].min()) if len(analysis.tables.requests) else None,
        last_request_ns=int(analysis.tables.requests["end_ns"].max()) if len(analysis.tables.requests) else None,
    )


def write_report(analysis: Analysis, path: str | Path) -> None:
    replace_file(path, render_report(analysis))
