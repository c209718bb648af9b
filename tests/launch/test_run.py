"""`vlmtrace run`: the program and the Python processes it starts are instrumented once they import lmdeploy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vlmtrace.launch import BOOTSTRAP_DIR, ENV_ACTIVE, ENV_CONFIGURE, environment, parse

REPO = Path(__file__).resolve().parents[2]


def _headers(journal: Path) -> list[dict]:
    headers = []
    for path in sorted(journal.glob("*.jsonl")):
        records = [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]
        header = records[0]
        header["kinds"] = {record["k"] for record in records}
        headers.append(header)
    return headers


def test_the_environment_puts_the_bootstrap_first_once_and_the_journal_at_an_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = environment(
        {"PYTHONPATH": f"/a{os.pathsep}{BOOTSTRAP_DIR}{os.pathsep}/b"},
        journal="j",
        otlp_endpoint="http://c:4318",
        service_name="svc",
    )
    assert env["PYTHONPATH"].split(os.pathsep) == [BOOTSTRAP_DIR, "/a", "/b"]
    assert env[ENV_ACTIVE] == "1"
    assert env["VLMTRACE_JOURNAL"] == str(tmp_path / "j")
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://c:4318" and env["OTEL_SERVICE_NAME"] == "svc"
    assert env[ENV_CONFIGURE] == "otlp" and ENV_CONFIGURE not in environment({})  # configure() only when asked
    assert environment({})["VLMTRACE_JOURNAL"] == str(tmp_path / "vlmtrace-journal")
    assert environment({"VLMTRACE_JOURNAL": "rel"})["VLMTRACE_JOURNAL"] == str(tmp_path / "rel")
    assert environment({}, journal="off")["VLMTRACE_JOURNAL"] == "off"
    assert (Path(BOOTSTRAP_DIR) / "sitecustomize.py").is_file()


def test_arguments_are_options_then_the_command(capsys):
    parsed = parse(["--journal", "d", "--", "python", "-m", "x", "--journal", "y"])
    assert (parsed.journal, parsed.command) == ("d", ["python", "-m", "x", "--journal", "y"])
    parsed = parse(["--otlp-endpoint=http://c", "lmdeploy", "serve"])
    assert (parsed.otlp_endpoint, parsed.command) == ("http://c", ["lmdeploy", "serve"])
    parsed = parse(["python", "--journal", "d", "-h"])
    assert (parsed.journal, parsed.command) == (None, ["python", "--journal", "d", "-h"])
    for bad, message in (
        (["--jornal", "d", "python"], "unrecognized arguments: --jornal"),
        (["--journal"], "expected one argument"),
        (["--journal", "d"], "a COMMAND to start is needed"),
    ):
        with pytest.raises(SystemExit) as exit_:
            parse(bad)
        assert exit_.value.code == 2 and message in capsys.readouterr().err


def _run(args: list[str], tmp_path: Path, extra_pythonpath: str = "") -> subprocess.CompletedProcess:
    """`python -m vlmtrace run ARGS` with this interpreter's scripts first on PATH (as in an activated venv),
    torch's compiled counters not built unless a test turns them on."""
    env = dict(
        {"VLMTRACE_NATIVE_COUNTERS": "0", **os.environ},
        PYTHONPATH=os.pathsep.join(p for p in (extra_pythonpath, str(REPO / "src"), str(REPO)) if p),
        PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        VLMTRACE_SAMPLE_INTERVAL_MS="0",
    )
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "VLMTRACE_JOURNAL"):
        env.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "vlmtrace", "run", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.lmdeploy
def test_the_program_and_its_spawned_child_write_their_own_journals(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os\nwith open(os.environ['MARKS'], 'a') as f: f.write(f'{os.getpid()}\\n')\n"
    )
    marks = tmp_path / "marks.txt"
    os.environ["MARKS"] = str(marks)
    try:
        done = _run(
            ["--journal", "j", "--", sys.executable, str(REPO / "tests" / "launch" / "program.py")],
            tmp_path,
            extra_pythonpath=str(site),
        )
    finally:
        del os.environ["MARKS"]
    assert done.returncode == 0, done.stderr[-3000:]
    assert "instrumented=True child_exit=0 helper_imported_vlmtrace_instrumentation=False" in done.stdout

    headers = _headers(tmp_path / "j")
    assert len(headers) == 2, [h["argv"] for h in headers]  # the helper never imported lmdeploy: no journal
    # a spawned child gets its parent's sys.argv: the parent is the one whose pid is the other's ppid
    parent, child = sorted(headers, key=lambda h: h["pid"] != headers[1 - headers.index(h)]["ppid"])
    assert parent["argv"][0].endswith("program.py")
    assert child["ppid"] == parent["pid"]
    assert all("end_marker" in h["kinds"] for h in headers)  # both exited cleanly
    # the hidden sitecustomize still ran: in the program, the spawned child, the helper and multiprocessing's
    # resource tracker (which, like the helper, has no journal)
    pids = {int(line) for line in marks.read_text().split()}
    assert {parent["pid"], child["pid"]} <= pids and len(pids) == 4


@pytest.mark.lmdeploy
def test_a_console_script_is_instrumented(tmp_path):
    script = Path(sys.executable).parent / "lmdeploy"
    if not script.exists():
        pytest.skip("no lmdeploy console script in this environment")
    done = _run(["--journal", "j", "--service-name", "console", "--", "lmdeploy", "--help"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (header,) = _headers(tmp_path / "j")
    assert Path(header["argv"][0]).name == "lmdeploy"
    assert header["resource"]["service.name"] == "console"
    assert "end_marker" in header["kinds"]


def test_a_missing_command_is_reported(tmp_path):
    done = _run(["--", "no-such-program-vlmtrace"], tmp_path)
    assert done.returncode == 127
    assert done.stderr == "vlmtrace run: no-such-program-vlmtrace: command not found\n"  # as a shell says it
    assert _run([], tmp_path).returncode == 2
    done = _run(["--help"], tmp_path)
    assert (
        done.returncode == 0
        and done.stdout.startswith("Usage: vlmtrace run [OPTIONS]")
        and "--journal PATH" in done.stdout
    )


def test_heap_counter_is_preloaded_into_the_program(tmp_path, monkeypatch):
    program = "from vlmtrace.probes.heap import in_use_reader; print('counted', in_use_reader()() > 0)"
    done = _run(["--journal", "off", "--heap-counter", "--", sys.executable, "-c", program], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "counted True"


def test_torch_counters_are_built_before_the_program_starts_or_their_absence_explained(tmp_path, monkeypatch):
    """`vlmtrace run` builds the compiled read of torch's counters once per torch installation, before the
    program starts (an instrumented process never runs a compiler); a build that fails leaves the program
    reading them through Python, and it starts all the same."""
    pytest.importorskip("torch")
    marker = tmp_path / "compiler-ran"
    fake = tmp_path / "fake-c++"
    fake.write_text(f'#!/bin/sh\necho "$*" >> "{marker}"\nexit 1\n')
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    monkeypatch.setenv("VLMTRACE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("VLMTRACE_NATIVE_COUNTERS", "1")
    done = _run(["--journal", "off", "--", sys.executable, "-c", "print('started')"], tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "started"
    assert "torch_counters.cpp" in marker.read_text()
    assert (
        "vlmtrace run: torch's allocator counters are read through Python: compiling torch_counters.cpp failed"
        in done.stderr
    )
    marker.unlink()
    monkeypatch.setenv("VLMTRACE_NATIVE_COUNTERS", "0")
    assert _run(["--journal", "off", "--", sys.executable, "-c", "print('started')"], tmp_path).returncode == 0
    assert not marker.exists()  # not wanted: not built
