"""`vlmtrace doctor`: what vlmtrace would see and hook in this environment, before it matters.

It imports the hook targets' modules (instrument() itself waits for the application to import
them) and reads the memory probes once; it never initialises CUDA. The target family is chosen
as instrument() chooses it, except that a version no family covers is matched by importing.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import urllib.parse
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from vlmtrace import __version__
from vlmtrace.config import Options
from vlmtrace.instrumentation import selection, targets
from vlmtrace.probes.memory import MemoryProbe


def _endpoint_reachable(endpoint: str) -> str:
    parsed = urllib.parse.urlparse(endpoint if "://" in endpoint else f"http://{endpoint}")
    port = parsed.port or (443 if parsed.scheme == "https" else 4318)
    try:
        with socket.create_connection((parsed.hostname or "localhost", port), timeout=1):
            return "reachable"
    except OSError as error:
        return f"not reachable: {error}"


def _journal_writable(path: str | None) -> str:
    if path is None:
        return "off"
    directory = os.path.dirname(os.path.abspath(path)) if path.endswith(".jsonl") else os.path.abspath(path)
    probe_dir = directory
    while not os.path.exists(probe_dir):
        probe_dir = os.path.dirname(probe_dir)
    return f"{directory}: " + ("writable" if os.access(probe_dir, os.W_OK) else "NOT writable")


def diagnose() -> dict[str, Any]:
    options = Options.resolve()
    lmdeploy_version = targets.installed_lmdeploy_version()
    choice = selection.choose_family(lmdeploy_version, present=lambda t: targets.probe_target(t) == "found")
    family = choice.family
    probe = MemoryProbe(options.probes, options.devices)
    reading = probe.sample().attributes
    report = {
        "vlmtrace": __version__,
        "python": sys.version.split()[0],
        "lmdeploy": lmdeploy_version or "not installed",
        "family": family.name,
        "family_reason": choice.reason,
        "versions": probe.versions(),
        "probes": dict(probe.status),
        "reading": reading,
        "targets": {t.name: {"role": t.role, "required": t.required, "status": targets.probe_target(t)}
                    for t in family.targets},
        "journal": _journal_writable(options.journal),
        "otlp": (f"{options.otlp_protocol} {options.otlp_endpoint}: {_endpoint_reachable(options.otlp_endpoint)}"
                 if options.otlp_endpoint else "off (no OTEL_EXPORTER_OTLP_ENDPOINT)"),
        "metrics": _metrics_destination(options),
        "options": options.describe(),
    }
    probe.close()
    return report


def _metrics_destination(options: Options) -> str:
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider

    from vlmtrace.export.metrics import metrics_endpoint, metrics_protocol, otlp_metrics_wanted

    if not options.metrics:
        return "off (VLMTRACE_METRICS=false)"
    if isinstance(metrics.get_meter_provider(), MeterProvider):
        return "into the application's MeterProvider"
    if otlp_metrics_wanted(options):
        return f"{metrics_protocol(options)} {metrics_endpoint(options) or 'as OTEL_EXPORTER_OTLP_* say, or the default'}"
    return "none recorded: no OTLP endpoint and no MeterProvider"


def doctor(as_json: bool = typer.Option(False, "--json", help="Print the report as JSON.")) -> None:
    """Show versions, probes, hook targets found or missing, and the resolved configuration."""
    report = diagnose()
    missing_required = [name for name, t in report["targets"].items()
                        if t["required"] and not t["status"].startswith("found")]
    if as_json:
        print(json.dumps(report, indent=1, default=str))
        raise typer.Exit(1 if missing_required else 0)
    console = Console()
    console.print(f"[bold]vlmtrace {report['vlmtrace']}[/] on Python {report['python']}; "
                  f"LMDeploy {report['lmdeploy']} → target family [bold]{report['family']}[/] "
                  f"({report['family_reason']})")
    for name, version in report["versions"].items():
        console.print(f"  {name}: {version}")
    probes = Table("probe", "status", title="Memory probes")
    for name, status in report["probes"].items():
        probes.add_row(name, status)
    console.print(probes)
    if report["reading"]:
        console.print("  now: " + ", ".join(f"{k.removeprefix('vlmtrace.mem.')}={v}" for k, v in report["reading"].items()))
    table = Table(title="Hook targets")
    table.add_column("target", overflow="fold")
    table.add_column("role")
    table.add_column("status", overflow="fold")
    for name, target in report["targets"].items():
        style = "green" if target["status"] == "found" else ("red" if target["required"] else "yellow")
        table.add_row(name, target["role"], f"[{style}]{target['status']}[/]")
    console.print(table)
    console.print(f"journal: {report['journal']}")
    console.print(f"OTLP: {report['otlp']}")
    console.print(f"metrics: {report['metrics']}")
    if missing_required:
        console.print(f"[red]{len(missing_required)} required target(s) missing[/]: spans from them will be absent.")
        raise typer.Exit(1)
