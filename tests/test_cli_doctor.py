"""`vlmtrace doctor` on this CPU test install: TurboMind's extension cannot load here by design."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from vlmtrace import semconv as sc
from vlmtrace.cli import doctor
from vlmtrace.cli.main import app

runner = CliRunner()


def _doctor(*arguments: str) -> subprocess.CompletedProcess:
    """A fresh interpreter, as a person runs it: other tests put TurboMind's stand-in into sys.modules."""
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "vlmtrace", "doctor", *arguments], capture_output=True, text=True, env=env, timeout=120
    )


def test_absent_turbomind_extension_is_named_and_is_not_a_failure():
    result = _doctor()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "TurboMind's native extension cannot load" in result.stdout
    assert "required target(s) missing" not in result.stdout
    assert "│ not here: TurboMind's native extension cannot load" in result.stdout  # the target's own row


def test_install_hint_keeps_its_brackets(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # as on a machine without nvidia-ml-py
    result = runner.invoke(app, ["doctor"], env={"COLUMNS": "200"})
    assert "pip install 'vlmtrace[gpu]'" in result.output


def test_without_lmdeploy_one_line_and_exit_2(monkeypatch):
    monkeypatch.setattr(doctor.targets, "installed_lmdeploy_version", lambda: None)
    monkeypatch.setattr(doctor.targets, "probe_target", lambda target: "missing: import failed (ModuleNotFoundError)")
    result = runner.invoke(app, ["doctor"], env={"COLUMNS": "200"})
    assert result.exit_code == doctor.EXIT_NO_LMDEPLOY
    assert result.output.count("LMDeploy is not installed") == 1
    assert "ModuleNotFoundError" not in result.output and "Hook targets" not in result.output


def test_without_lmdeploy_no_target_family_is_claimed(monkeypatch):
    monkeypatch.setattr(doctor.targets, "installed_lmdeploy_version", lambda: None)
    monkeypatch.setattr(doctor.targets, "probe_target", lambda target: "missing: import failed (ModuleNotFoundError)")
    result = runner.invoke(app, ["doctor"], env={"COLUMNS": "200"})
    assert "target family" not in result.output and "required targets exist" not in result.output


def test_a_reading_is_shown_in_human_units():
    reading = {
        sc.MEM_READ_TIME: 1796488653562922684,
        sc.MEM_HOST_RSS: 796561408,
        sc.MEM_TORCH_OOMS: 0,
        sc.MEM_TORCH_ALLOCATED + sc.PER_DEVICE_SUFFIX: [3 << 30, 512],
    }
    assert (
        doctor.reading_in_words(reading)
        == "host.rss 759.7 MiB, torch.ooms 0, torch.allocated.per_device 3.0 GiB / 512 B"
    )


# A fresh interpreter in which the named packages cannot be imported and their distributions are not
# installed (a distribution named with dots for dashes), as in an install without the extras that bring
# them, running `vlmtrace doctor` as its command line does.
_WITHOUT = """
import runpy, sys
blocked = tuple(sys.argv[1].split(","))
def absent(name):
    name = name.lower().replace("-", ".").replace("_", ".")
    return name in blocked or name.startswith(tuple(b + "." for b in blocked))
class Without:  # each finder, blind to them: import fails, find_spec says None, importlib.metadata finds none
    def __init__(self, finder):
        self.finder = finder
    def __getattr__(self, name):
        return getattr(self.finder, name)
    def find_spec(self, name, path=None, target=None):
        return None if absent(name) else self.finder.find_spec(name, path, target)
    def find_distributions(self, *args, **kwargs):
        finder = getattr(self.finder, "find_distributions", None)
        return [] if finder is None else [d for d in finder(*args, **kwargs) if not absent(d.metadata["Name"])]
sys.meta_path[:] = [Without(finder) for finder in sys.meta_path]
sys.argv = ["vlmtrace", *sys.argv[2:]]
runpy.run_module("vlmtrace", run_name="__main__")
"""
OTLP_EXTRA = ("opentelemetry.sdk", "opentelemetry.exporter")


def _doctor_without(packages: tuple[str, ...], *arguments: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "400", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT, ",".join(packages), "doctor", *arguments],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )


def test_without_the_otlp_extra_each_export_check_names_it_and_doctor_goes_on():
    result = _doctor_without(OTLP_EXTRA)
    assert "Traceback" not in result.stdout + result.stderr, result.stderr[-3000:]
    assert result.returncode == 0, result.stdout + result.stderr  # LMDeploy's hooks are found all the same
    metrics = next(line for line in result.stdout.splitlines() if line.startswith("metrics: "))
    otlp = next(line for line in result.stdout.splitlines() if line.startswith("OTLP: "))
    assert "none recorded: needs the otlp extra, the OpenTelemetry SDK (pip install 'vlmtrace[otlp]')" in metrics
    assert "nothing exported: needs the otlp extra" in otlp
    assert "Hook targets" in result.stdout


def test_with_the_report_extra_alone_doctor_reads_what_it_can_and_names_the_rest():
    """The demo's install: no SDK, no nvidia-ml-py, no torch, no LMDeploy; --json keeps the same words."""
    result = _doctor_without((*OTLP_EXTRA, "pynvml", "nvidia.ml.py", "torch", "lmdeploy"), "--json")
    assert "Traceback" not in result.stdout + result.stderr, result.stderr[-3000:]
    assert result.returncode == doctor.EXIT_NO_LMDEPLOY, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert "needs the otlp extra" in report["metrics"] and "needs the otlp extra" in report["otlp"]
    assert "pip install 'vlmtrace[gpu]'" in report["probes"]["nvml"]
    assert report["torch_counters"] == "torch not installed"
    assert report["probes"]["host"] == "ok" and report["reading"]


def test_build_compiles_the_torch_counters_first_and_says_what_came_of_it(monkeypatch, tmp_path):
    """`--build` runs the C++ compiler here, in the command (an instrumented process never does): a failed
    build is said, and the report says the counters stay on the Python path."""
    pytest.importorskip("torch")
    fake = tmp_path / "fake-c++"
    fake.write_text(f'#!/bin/sh\necho ran > "{tmp_path / "ran"}"\nexit 1\n')
    fake.chmod(0o755)
    env = {"COLUMNS": "200", "CXX": str(fake), "VLMTRACE_CACHE_DIR": str(tmp_path / "cache")}
    result = runner.invoke(app, ["doctor", "--build"], env=env)
    assert (tmp_path / "ran").exists()
    assert "torch's counters build: not built: compiling torch_counters.cpp failed" in result.output
    assert "torch's counters: Python path until built" in result.output
    assert "torch's counters build" not in runner.invoke(app, ["doctor"], env=env).output


@pytest.mark.parametrize(
    "endpoint",
    [
        "https://user:hunter2-s3cr3t@collector:4318",
        "http://collector:4318/?api_key=hunter2-s3cr3t",
        "http://collector:4318/#access_token=hunter2-s3cr3t",
    ],
)
@pytest.mark.parametrize("as_json", [[], ["--json"]])
def test_an_endpoint_holding_a_secret_is_shown_redacted(monkeypatch, endpoint, as_json):
    """doctor's output lands in CI logs and issue reports: an endpoint's password or key is not in it."""
    monkeypatch.setattr(doctor.targets, "installed_lmdeploy_version", lambda: None)
    monkeypatch.setattr(doctor.targets, "probe_target", lambda target: "missing: import failed (ModuleNotFoundError)")
    result = runner.invoke(app, ["doctor", *as_json], env={"COLUMNS": "200", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
    assert result.exit_code == doctor.EXIT_NO_LMDEPLOY, result.output
    assert "hunter2-s3cr3t" not in result.output and "<redacted>" in result.output and "collector:4318" in result.output
