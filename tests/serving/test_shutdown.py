"""LMDeploy's real api_server (PyTorch engine in its own spawned process, CPU stand-in engine) under
`vlmtrace run`, stopped the ways a service is stopped: SIGTERM (Kubernetes, docker, systemd), SIGINT
(Ctrl-C), and the service's own `sys.exit`. Every process's journal ends with an end record, the server's
names the signal, the server dies the way it would without vlmtrace, and the report calls none of them
crashed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the api_server needs fastapi and uvicorn (scripts/setup installs them)")
pytest.importorskip("uvicorn")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from gpu_api_server import (
    chat,
    png_data_url,
    read_journal_file,
    server_command,
    wait_until_up,
)

from tests.serving.test_api_server import _free_port

# A supervisor starts a service with the default action for SIGINT and SIGTERM and no signal blocked. A child of
# the test process inherits the test run's: a shell starts a background job with SIGINT ignored, an ignored SIGINT
# survives exec, and uvicorn's re-raised SIGINT is then ignored. This starter puts the defaults back and execs the
# command (the same pid).
SUPERVISOR_START = """
import os, signal, sys
for number in (signal.SIGINT, signal.SIGTERM):
    signal.signal(number, signal.SIG_DFL)
signal.pthread_sigmask(signal.SIG_SETMASK, [])
os.execv(sys.argv[1], sys.argv[1:])
"""


def _serve_and_stop(tmp_path: Path, stop_signal: int) -> tuple[int | None, int, Path]:
    """The server's exit status, its pid (`vlmtrace run` execs the command: the same process) and the journal."""
    journal = tmp_path / "journal"
    port = _free_port()
    command = server_command(
        str(REPO / "tests" / "data" / "tiny-qwen2vl"),
        "pytorch",
        port,
        journal,
        None,
        "tests.serving.exit_on_sigusr1",
        ["--max-batch-size", "4"],
    )
    env = {name: value for name, value in os.environ.items() if not name.startswith(("VLMTRACE_", "OTEL_"))}
    env.update(PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]), VLMTRACE_SHUTDOWN_TIMEOUT_MS="2000")
    env["OTEL_TRACES_EXPORTER"] = env["OTEL_METRICS_EXPORTER"] = "none"
    with open(tmp_path / "server.log", "w") as log:
        server = subprocess.Popen(
            [sys.executable, "-c", SUPERVISOR_START, *command], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        base_url = f"http://127.0.0.1:{port}"
        model = wait_until_up(base_url, server, 240)
        answer = chat(base_url, model, png_data_url(64, 64, 1), f"00-{'1' * 32}-{'2' * 16}-01", stream=False)
        assert answer["status"] == 200
        time.sleep(1.0)  # the response's task done: sys.exit from SIGUSR1's handler then leaves the event loop
        server.send_signal(stop_signal)
        try:
            returncode = server.wait(90)
        except subprocess.TimeoutExpired:
            returncode = None  # still running: the assertion shows the log
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    return returncode, server.pid, journal


def _ends(journal: Path) -> dict[int, dict | None]:
    """Each process's end record (None where it has none), by pid."""
    ends: dict[int, dict | None] = {}
    for path in sorted(journal.glob("*.jsonl")):
        records = read_journal_file(path)
        pid = records[0]["pid"]
        ends[pid] = ends.get(pid) or next((r for r in records if r["k"] == "end_marker"), None)
    return ends


@pytest.mark.lmdeploy
@pytest.mark.parametrize(
    "stop, returncode, ended_by",
    [
        (signal.SIGTERM, -signal.SIGTERM, "SIGTERM"),  # uvicorn shuts down, then raises SIGTERM again
        (signal.SIGINT, 0, "SIGINT"),  # uvicorn shuts down and raises SIGINT again: LMDeploy's CLI then exits 0
        (signal.SIGUSR1, 0, None),  # the service's own sys.exit(0)
    ],
    ids=["SIGTERM", "SIGINT", "sys.exit"],
)
def test_every_process_of_a_stopped_api_server_ends_its_journal(tmp_path, stop, returncode, ended_by):
    code, pid, journal = _serve_and_stop(tmp_path, stop)

    log = (tmp_path / "server.log").read_text(errors="replace")[-4000:]
    assert code == returncode, log
    ends = _ends(journal)
    assert len(ends) >= 2, log  # the server and its engine process
    assert all(end is not None and end["clean"] for end in ends.values()), (ends, log)
    assert ends[pid].get("ended_by") == ended_by
    assert all(end.get("ended_by") in (None, "SIGTERM") for other, end in ends.items() if other != pid)

    summary_path = tmp_path / "summary.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "vlmtrace",
            "report",
            str(journal),
            "-o",
            str(tmp_path / "r.html"),
            "--json",
            str(summary_path),
        ],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=str(REPO / "src")),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(summary_path.read_text())
    assert summary["crashed"] is False
    endings = {process["ended"] for process in summary["processes"]}
    assert endings <= {"clean end", "stopped by SIGTERM (clean end)", "stopped by SIGINT (clean end)"}
    if ended_by is not None:
        assert f"stopped by {ended_by} (clean end)" in endings
