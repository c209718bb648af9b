"""An instrumented process never runs a compiler: the compiled core comes with the installation. The real
LMDeploy pipeline over the stand-in engine, with no compiler on PATH (only stand-ins that record being
called, as $CC and $CXX too) and an empty cache directory, serves a request, and an abort in the middle of
the next still ends it by SIGABRT with its in-flight spans and Python's stacks in the journal."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.export.child_process import HERE as EXPORT_TESTS
from tests.export.child_process import start_python
from tests.export.journal_lines import journal_files, of_kind, read_journal_file
from vlmtrace import semconv as sc
from vlmtrace.export import fatal_guard

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "no_compiler_child.py")
COMPILERS = ("gcc", "cc", "g++", "c++", "clang", "ld")


@pytest.fixture
def no_compiler(tmp_path) -> tuple[dict[str, str], Path, Path]:
    """The child's environment: PATH holds only recording stand-ins for the compilers, next to Python's own
    directory; $CC and $CXX name one; the cache directory is empty. Returns it, the cache and the marker
    file the stand-ins write."""
    bin_dir, cache, marker = tmp_path / "bin", tmp_path / "cache", tmp_path / "compiler-ran"
    bin_dir.mkdir()
    cache.mkdir()
    for name in COMPILERS:
        fake = bin_dir / name
        fake.write_text(f'#!/bin/sh\necho "{name} $*" >> "{marker}"\nexit 1\n')
        fake.chmod(0o755)
    env = {
        "PATH": f"{bin_dir}{os.pathsep}/bin",
        "CC": str(bin_dir / "cc"),
        "CXX": str(bin_dir / "c++"),
        "XDG_CACHE_HOME": str(cache),
        "VLMTRACE_CACHE_DIR": "",
        "VLMTRACE_SAMPLE_INTERVAL_MS": "20",
        "PYTHONPATH": os.pathsep.join(
            [os.path.dirname(os.path.dirname(EXPORT_TESTS)), os.environ.get("PYTHONPATH", "")]
        ),
    }
    return env, cache, marker


def test_the_compiled_core_is_installed():
    assert fatal_guard.guard() is not None, "build it: pip install -e . (or python setup.py build_ext --inplace)"


@pytest.mark.parametrize("abort", ["os", "libc"])
def test_an_instrumented_pipeline_runs_no_compiler_and_an_abort_still_ends_it_by_sigabrt(tmp_path, no_compiler, abort):
    env, cache, marker = no_compiler
    child = start_python(CHILD, str(tmp_path / "j"), abort, **env)
    try:
        out, err = child.communicate(timeout=240)
    finally:
        child.kill()

    assert child.returncode == -signal.SIGABRT, err[-3000:]
    assert out.splitlines() == ["served"]
    assert not marker.exists(), marker.read_text()
    assert [path for path in cache.rglob("*") if "vlmtrace" in str(path) or path.suffix == ".so"] == []
    (path,) = journal_files(tmp_path / "j")
    records, fatal = read_journal_file(path)
    ended = {record["span_id"] for record in of_kind(records, "end")}
    flying = [record["name"] for record in of_kind(records, "start") if record["span_id"] not in ended]
    assert sc.SPAN_PIPELINE_STREAM_INFER in flying and "chat tiny-qwen2vl" in flying
    assert fatal.startswith("Fatal Python error: Aborted")
    assert "no_compiler_child.py" in fatal


def test_a_missing_core_is_one_warning_naming_its_cost_and_the_journal_runs_without_the_guard(tmp_path):
    """An installation without the compiled core (built where no compiler was): instrument() warns once,
    faulthandler alone writes the stacks, and an abort still ends the process by SIGABRT."""
    code = (
        "import sys, os; sys.modules['vlmtrace._core'] = None\n"
        "import vlmtrace\n"
        f"vlmtrace.instrument(journal={str(tmp_path / 'j')!r})\n"
        "vlmtrace.uninstrument()\n"
        f"vlmtrace.instrument(journal={str(tmp_path / 'j')!r})\n"
        "os.abort()\n"
    )
    child = start_python("-c", code)
    _out, err = child.communicate(timeout=120)

    assert child.returncode == -signal.SIGABRT
    warnings = [line for line in err.splitlines() if "the compiled core is missing" in line]
    assert (
        len(warnings) == 1
        and "fatal signals are not guarded against a native handler that hangs" in warnings[0]
        and "~6 µs more a reading" in warnings[0]
    )
    assert any(
        read_journal_file(path)[1].startswith("Fatal Python error: Aborted") for path in journal_files(tmp_path / "j")
    )
