"""`vlmtrace doctor` on this CPU test install: TurboMind's extension cannot load here by design."""

from __future__ import annotations

import sys

from typer.testing import CliRunner

from vlmtrace.cli import doctor
from vlmtrace.cli.main import app

runner = CliRunner()


def test_absent_turbomind_extension_is_named_and_is_not_a_failure():
    result = runner.invoke(app, ["doctor"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "TurboMind's native extension cannot load" in result.output
    assert "required target(s) missing" not in result.output
    report = doctor.diagnose()
    turbomind = [t["status"] for name, t in report["targets"].items() if name.startswith("lmdeploy.turbomind")]
    assert turbomind and all(status.startswith("not here") for status in turbomind)


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
