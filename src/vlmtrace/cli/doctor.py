"""`vlmtrace doctor`: what vlmtrace would see and hook in this environment, before it matters.

It imports the hook targets' modules (instrument() itself waits for the application to import
them) and reads the memory probes once; it never initialises CUDA. The target family is chosen
as instrument() chooses it, except that a version no family covers is matched by importing.

Exit codes: 0 ready (every required hook target found, or missing only because TurboMind's native
extension is not installed, so that engine cannot run here anyway); 1 a required hook target of an
installed engine is missing (its spans will be absent: a version vlmtrace does not cover yet);
2 LMDeploy is not installed (nothing to hook).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from vlmtrace import __version__
from vlmtrace import semconv as sc
from vlmtrace.config import Options
from vlmtrace.export.journal.redaction import redacted_text
from vlmtrace.instrumentation import selection, targets
from vlmtrace.probes import native_counters
from vlmtrace.probes.memory import MemoryProbe
from vlmtrace.report.terminal import escaped, new_console


def _endpoint_reachable(endpoint: str) -> str:
    try:
        parsed = urllib.parse.urlparse(endpoint if "://" in endpoint else f"http://{endpoint}")
        port = parsed.port or (443 if parsed.scheme == "https" else 4318)
    except ValueError as error:  # an unclosed IPv6 bracket, a port that is not a number or past 65535
        return f"not a URL: {error}"
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


EXIT_TARGET_MISSING = 1
EXIT_NO_LMDEPLOY = 2
TURBOMIND_MODULE = "lmdeploy.turbomind"
# Where TurboMind's compiled extension lives (0.6 on, then 0.4-0.5); it loads only where CUDA does.
TURBOMIND_EXTENSIONS = ("lmdeploy.turbomind._turbomind", "lmdeploy.lib._turbomind")
NO_EXTENSION = "not here: TurboMind's native extension cannot load ({}), so TurboMind cannot run"


def _turbomind_extension_error() -> str | None:
    """Why TurboMind's extension does not load (None when it does)."""
    reason = "not installed"
    for name in TURBOMIND_EXTENSIONS:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        except (ImportError, OSError) as error:
            reason = str(error).splitlines()[0][:160]
            continue
        return None
    return reason


def _target_status(target: targets.Target, extension_error: str | None) -> str:
    status = targets.probe_target(target)
    if status != "found" and target.module.startswith(TURBOMIND_MODULE) and extension_error is not None:
        return NO_EXTENSION.format(extension_error)
    return status


def _engine_absent(status: str) -> bool:
    return status.startswith(NO_EXTENSION.split("(", maxsplit=1)[0])


def diagnose() -> dict[str, Any]:
    options = Options.resolve()
    lmdeploy_version = targets.installed_lmdeploy_version()
    extension_error = _turbomind_extension_error() if lmdeploy_version else None
    choice = selection.choose_family(lmdeploy_version, present=lambda t: targets.probe_target(t) == "found")
    family = choice.family
    probe = MemoryProbe(options.probes, options.devices, native_counters=options.native_counters)
    reading = probe.sample().attributes
    report = {
        "vlmtrace": __version__,
        "python": sys.version.split()[0],
        "lmdeploy": lmdeploy_version or "not installed",
        "family": family.name,
        "family_reason": choice.reason,
        "versions": probe.versions(),
        "probes": dict(probe.status),
        "torch_counters": _torch_counters(options),
        "heap_counter": _heap_counter(),
        "reading": reading,
        "targets": {
            t.name: {"role": t.role, "required": t.required, "status": _target_status(t, extension_error)}
            for t in family.targets
        }
        if lmdeploy_version
        else {},
        "journal": _journal_writable(options.journal),
        "otlp": _otlp_destination(options),
        "metrics": _metrics_destination(options),
        "options": {
            **options.describe(),
            "otlp_endpoint": options.otlp_endpoint and redacted_text(options.otlp_endpoint),
        },
    }
    probe.close()
    return report


def _torch_counters(options: Options) -> str:
    """How torch's allocator counters would be read, found without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return "torch not installed"
    return native_counters.readiness(
        Path(spec.submodule_search_locations[0]), options.native_counters and "torch" in options.probes
    )


def _heap_counter() -> str:
    """Whether this process runs with the heap counter, and whether this installation has it to preload."""
    from vlmtrace.probes import heap

    if heap.in_use_reader() is not None:
        return "loaded: host readings carry the heap's bytes in use"
    library = heap.library_path()
    if library is None:
        return "not in this installation (it is built with the wheel on Linux)"
    return f"not loaded ({library}; `vlmtrace run --heap-counter` preloads it)"


def _build_torch_counters(options: Options) -> str:
    """`--build`: the compiled read of torch's counters for the installed torch, built now if it is not yet."""
    if not options.native_counters or "torch" not in options.probes:
        return "not built: torch's counters are read through Python (native_counters is off)"
    try:
        return f"built: {native_counters.build()}"
    except (RuntimeError, OSError, subprocess.SubprocessError) as error:
        return f"not built: {error}"


OTLP_EXTRA = "needs the otlp extra, the OpenTelemetry SDK (pip install 'vlmtrace[otlp]')"


def _sdk_missing() -> str | None:
    """What is missing where the OpenTelemetry SDK, which the otlp extra brings, cannot be imported (None when it can)."""
    try:
        import opentelemetry.sdk.metrics  # noqa: F401
    except ImportError:
        return OTLP_EXTRA
    return None


def _otlp_destination(options: Options) -> str:
    if not options.otlp_endpoint:
        return "off (no OTEL_EXPORTER_OTLP_ENDPOINT)"
    destination = (
        f"{options.otlp_protocol} {redacted_text(options.otlp_endpoint)}: {_endpoint_reachable(options.otlp_endpoint)}"
    )
    missing = _sdk_missing()
    return destination if missing is None else f"{destination}; nothing exported: {missing}"


def _metrics_destination(options: Options) -> str:
    if not options.metrics:
        return "off (VLMTRACE_METRICS=false)"
    missing = _sdk_missing()
    if missing is not None:
        return f"none recorded: {missing}"
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider

    from vlmtrace.export.metrics import (
        metrics_endpoint,
        metrics_protocol,
        otlp_metrics_wanted,
    )

    if isinstance(metrics.get_meter_provider(), MeterProvider):
        return "into the application's MeterProvider"
    if otlp_metrics_wanted(options):
        endpoint = metrics_endpoint(options)
        return f"{metrics_protocol(options)} {redacted_text(endpoint) if endpoint else 'as OTEL_EXPORTER_OTLP_* say, or the default'}"
    return "none recorded: no OTLP endpoint and no MeterProvider"


COUNTS = (sc.MEM_TORCH_ALLOC_RETRIES, sc.MEM_TORCH_OOMS)
NOT_SHOWN = (sc.MEM_READ_TIME, sc.MEM_DEVICES)  # when and for which devices: the reading is now, for those listed


def _bytes(value: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(value) >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:g} B"


def reading_in_words(reading: dict[str, Any]) -> str:
    """One memory reading as a person reads it: `host.rss 760.2 MiB, torch.ooms 0`."""

    def shown(key: str, value: Any) -> str:
        values = value if isinstance(value, (list, tuple)) else [value]
        words = [str(v) if key in COUNTS or not isinstance(v, (int, float)) else _bytes(v) for v in values]
        return f"{key.removeprefix('vlmtrace.mem.')} {' / '.join(words)}"

    return ", ".join(shown(key, value) for key, value in reading.items() if key not in NOT_SHOWN)


def missing_required(report: dict[str, Any]) -> list[str]:
    """Required targets that are absent for a reason other than an engine that cannot run here."""
    return [
        name
        for name, t in report["targets"].items()
        if t["required"] and t["status"] != "found" and not _engine_absent(t["status"])
    ]


def exit_code(report: dict[str, Any]) -> int:
    if not report["targets"]:
        return EXIT_NO_LMDEPLOY
    return EXIT_TARGET_MISSING if missing_required(report) else 0


def doctor(
    as_json: bool = typer.Option(False, "--json", help="Print the readings as JSON."),
    build: bool = typer.Option(
        False,
        "--build",
        help="Build the compiled read of torch's allocator counters "
        "for the installed torch first (the system's C++ compiler; `vlmtrace run` "
        "builds it too).",
    ),
) -> None:
    """Show what vlmtrace would see and hook in this environment.

    Versions, the memory probes and what they read now, the LMDeploy functions vlmtrace would wrap (found
    or missing), where spans and metrics would go, and the resolved configuration.

    \b
    Exit codes:
      0  ready (also when only TurboMind's native extension cannot load:
         that engine cannot run here)
      1  a required hook target of an engine that can run here is missing
      2  LMDeploy is not installed
    """
    built = _build_torch_counters(Options.resolve()) if build else None
    report = diagnose()
    if built is not None:
        report["torch_counters_build"] = built
    if as_json:
        print(json.dumps(report, indent=1, default=str))
        raise typer.Exit(exit_code(report))
    console = new_console()
    family = (
        f"; LMDeploy {escaped(report['lmdeploy'])} → target family [bold]{escaped(report['family'])}[/] "
        f"({escaped(report['family_reason'])})"
        if report["targets"]
        else ""
    )  # without LMDeploy: said below
    console.print(f"[bold]vlmtrace {escaped(report['vlmtrace'])}[/] on Python {report['python']}{family}")
    for name, version in report["versions"].items():
        console.print(f"  {escaped(name)}: {escaped(str(version))}")
    probes = Table("probe", "status", title="Memory probes")
    for name, status in report["probes"].items():
        probes.add_row(escaped(name), escaped(str(status)))
    console.print(probes)
    if report["reading"]:
        console.print("  now: " + escaped(reading_in_words(report["reading"])))
    if report["targets"]:
        table = Table(title="Hook targets")
        table.add_column("target", overflow="fold")
        table.add_column("role")
        table.add_column("status", overflow="fold")
        for name, target in report["targets"].items():
            status = target["status"]
            style = (
                "green"
                if status == "found"
                else ("red" if target["required"] and not _engine_absent(status) else "yellow")
            )
            table.add_row(escaped(name), escaped(target["role"]), f"[{style}]{escaped(status)}[/]")
        console.print(table)
    else:
        console.print(
            "[yellow]LMDeploy is not installed here: nothing to hook[/] (pip install lmdeploy); "
            "the probes and exporters above and below are what vlmtrace would use."
        )
    console.print(f"journal: {escaped(report['journal'])}")
    console.print(f"OTLP: {escaped(report['otlp'])}")
    console.print(f"metrics: {escaped(report['metrics'])}")
    if built is not None:
        console.print(f"torch's counters build: {escaped(built)}")
    console.print(f"torch's counters: {escaped(report['torch_counters'])}")
    console.print(f"heap counter: {escaped(report['heap_counter'])}")
    missing = missing_required(report)
    if missing:
        console.print(f"[red]{len(missing)} required target(s) missing[/]: spans from them will be absent.")
    elif any(_engine_absent(t["status"]) for t in report["targets"].values()):
        console.print(
            "TurboMind's native extension cannot load here, so its hooks wait unused; the PyTorch engine's are ready."
        )
    raise typer.Exit(exit_code(report))
