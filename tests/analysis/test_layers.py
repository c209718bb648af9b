"""The analysis layer imports without the rendering libraries, and never imports torch or LMDeploy."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PROBE = """
import sys

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"plotly", "jinja2", "torch", "lmdeploy"}:
            raise ImportError(f"{name} is not allowed here")

sys.meta_path.insert(0, Refuse())
import vlmtrace.analysis.pipeline, vlmtrace.analysis.readers.detect, vlmtrace.analysis.readers.remote
import vlmtrace.cli.main
print("ok")
"""


def test_analysis_imports_without_plotly_jinja2_torch_or_lmdeploy():
    done = subprocess.run([sys.executable, "-c", PROBE], env={"PYTHONPATH": str(SRC)}, capture_output=True, text=True)
    assert done.stdout.strip() == "ok", done.stderr


ANALYSIS = SRC / "vlmtrace" / "analysis"
STEPS = {"step1_loading": 1, "readers": 1, "step2_preparing": 2, "step3_verdict": 3, "step4_outlook": 4}
# Modules beside the step folders, by the step they belong to: 0 is what every step reads (the
# components and classes, the rules, line fitting, units, the summary's shape and its bounds); 5 runs or presents
# the steps' results.
BESIDE_STEPS = {
    "__init__": 0,
    "registry": 0,
    "rules": 0,
    "robust": 0,
    "units": 0,
    "summary": 0,
    "copied": 0,
    "trace_data": 1,
    "follow": 1,
    "follow_records": 1,
    "crash": 4,
    "endings": 4,
    "wording": 5,
    "pipeline": 5,
    "compare": 5,
    "live": 5,
}


def _step_of(module: str) -> int:
    parts = module.split(".")
    if parts[0] in STEPS:
        return STEPS[parts[0]]
    assert parts[0] in BESIDE_STEPS, f"vlmtrace.analysis.{module} belongs to no step: add it to a step folder"
    return BESIDE_STEPS[parts[0]]


def _analysis_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vlmtrace.analysis"):
            base = node.module.removeprefix("vlmtrace.analysis").lstrip(".")
            for alias in node.names:
                as_module = f"{base}.{alias.name}".lstrip(".")
                is_module = (ANALYSIS / Path(*as_module.split("."))).with_suffix(".py").exists() or (
                    ANALYSIS / Path(*as_module.split("."))
                ).is_dir()
                found.add(as_module if is_module else base)
        elif isinstance(node, ast.Import):
            found |= {
                a.name.removeprefix("vlmtrace.analysis.") for a in node.names if a.name.startswith("vlmtrace.analysis.")
            }
    return {name for name in found if name}


def test_no_analysis_module_imports_one_from_a_later_step():
    later = []
    for path in sorted(ANALYSIS.rglob("*.py")):
        module = ".".join(path.relative_to(ANALYSIS).with_suffix("").parts)
        step = _step_of(module)
        later += [
            f"{module} (step {step}) imports {name} (step {_step_of(name)})"
            for name in _analysis_imports(path)
            if _step_of(name) > step
        ]
    assert later == []


REPORT = SRC / "vlmtrace" / "report"


def test_the_report_draws_from_the_public_entry_points_only():
    reaching_in = {
        str(path.relative_to(REPORT)): sorted(_analysis_imports(path))
        for path in sorted(REPORT.rglob("*.py"))
        if _analysis_imports(path)
    }
    assert reaching_in == {}


def test_the_public_entry_points_all_resolve():
    from vlmtrace import analysis

    assert [name for name in analysis.__all__ if getattr(analysis, name, None) is None] == []
