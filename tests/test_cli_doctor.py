"""`vlmtrace doctor` on this CPU test install: TurboMind's extension cannot load here by design."""

from __future__ import annotations

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
    return subprocess.run([sys.executable, "-m", "vlmtrace", "doctor", *arguments], capture_output=True, text=True, env=env, timeout=120)


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
    reading = {sc.MEM_READ_TIME: 1796488653562922684, sc.MEM_HOST_RSS: 796561408, sc.MEM_TORCH_OOMS: 0,
               sc.MEM_TORCH_ALLOCATED + sc.PER_DEVICE_SUFFIX: [3 << 30, 512]}
    assert doctor.reading_in_words(reading) == "host.rss 759.7 MiB, torch.ooms 0, torch.allocated.per_device 3.0 GiB / 512 B"


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
