"""`vlmtrace top`: following journals written by vlmtrace's real writer, across rotation, a process
killed mid-span, a restart, and an abort's faulthandler text after the mapped tail's zero bytes.
A synthetic journal stands in for a two-GPU host. (The live view of a real LMDeploy pipeline:
tests/instrumentation/test_top_pipeline.py.)"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import pytest
from synthetic import Scenario
from typer.testing import CliRunner

from vlmtrace import semconv as sc
from vlmtrace.analysis import follow
from vlmtrace.analysis.follow import JournalFollower
from vlmtrace.analysis.live import live_view
from vlmtrace.cli.main import app
from vlmtrace.export.journal import JournalWriter, records

REPO = Path(__file__).resolve().parents[2]
CHILD = REPO / "tests" / "export" / "crash_child.py"
IN_FLIGHT = [sc.SPAN_PIPELINE_INFER, "chat tiny-vl", sc.SPAN_TURBOMIND_STREAM]
MiB, GiB = 1 << 20, 1 << 30
runner = CliRunner()


def _child(mode: str, journal: Path, **kwargs) -> subprocess.Popen:
    environment = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    environment.pop("PYTHONFAULTHANDLER", None)
    return subprocess.Popen([sys.executable, str(CHILD), mode, str(journal)], env=environment, **kwargs)


class Service:
    """A service's journal written by the real JournalWriter: requests that each keep 4 MiB of tensors."""

    def __init__(self, journal: Path, max_bytes: int, max_files: int) -> None:
        self.writer = JournalWriter.open(
            str(journal), max_bytes=max_bytes, max_files=max_files, resource={"service.name": "vl-test"}, versions={}
        )
        assert self.writer is not None
        self.requests = 0
        self.t = 1_800_000_000 * 10**9

    def memory(self) -> dict:
        return {
            sc.MEM_TORCH_ALLOCATED: 2 * GiB + self.requests * 4 * MiB,
            sc.MEM_TORCH_RESERVED: 3 * GiB + self.requests * 4 * MiB,
            sc.MEM_GPU_USED: 20 * GiB + self.requests * 4 * MiB,
            sc.MEM_GPU_TOTAL: 80 * GiB,
            sc.MEM_HOST_RSS: 1 * GiB,
        }

    def request(self, finish: bool = True) -> str:
        span = f"{self.requests + 1:016x}"
        self.t += 10**7
        attrs = {sc.STAGE: sc.STAGE_REQUEST}
        self.writer.write_span_start(
            records.start_record(
                self.t, "a" * 32, span, None, "chat tiny", "INTERNAL", "main", attrs, self.memory(), ()
            )
        )
        if finish:
            self.requests += 1
            self.t += 10**7
            self.writer.write_span_end(
                records.end_record(
                    self.t,
                    self.t - 10**7,
                    "a" * 32,
                    span,
                    None,
                    "chat tiny",
                    "INTERNAL",
                    "UNSET",
                    None,
                    attrs,
                    self.memory(),
                    None,
                    (),
                    (),
                )
            )
            self.writer.write_sample(self.t, self.memory())
        return span


def test_follows_rotation_without_losing_or_repeating_a_request(tmp_path: Path):
    journal = tmp_path / "journal"
    service = Service(journal, max_bytes=8192, max_files=3)
    follower = JournalFollower(str(journal), window=40)
    for _ in range(12):
        for _ in range(8):
            service.request()
        open_span = service.request(finish=False)
        assert service.writer.flush()
        follower.poll()
        (process,) = follower.processes.values()
        assert process.requests_completed == service.requests
        assert list(process.in_flight) == [open_span]
        service.writer.write_span_end(
            records.end_record(
                service.t,
                service.t,
                "a" * 32,
                open_span,
                None,
                "chat tiny",
                "INTERNAL",
                "UNSET",
                None,
                {sc.STAGE: sc.STAGE_REQUEST},
                service.memory(),
                None,
                (),
                (),
            )
        )
        service.requests += 1
    seqs = sorted(int(name.split(".")[-2]) for name in os.listdir(journal))
    assert seqs[0] > 3 and len(seqs) == 3, seqs  # the writer rotated past max_files, deleting the oldest files
    assert len(process.requests) == 40  # the window, not the whole run
    view = live_view(follower)
    (now,) = view.running
    tensor = next(item for item in now.components if item.component == "tensor")
    assert tensor.klass == "tensor_leak" and tensor.fit.slope == pytest.approx(4 * MiB)
    (device,) = now.devices
    headroom = 80 * GiB - (20 * GiB + service.requests * 4 * MiB)
    assert device.outlook.requests_to_oom == pytest.approx(headroom / (4 * MiB), rel=0.05)
    service.writer.close()
    follower.poll()
    assert live_view(follower).running == [] and process.clean_end and not process.crashed


def test_a_long_journal_is_read_from_near_its_end_after_its_header(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(follow, "START_BYTES", 16 * 1024)
    journal = tmp_path / "journal"
    service = Service(journal, max_bytes=1 << 20, max_files=2)
    for _ in range(200):
        service.request()
    assert service.writer.flush()
    follower = JournalFollower(str(journal))
    follower.poll()
    (process,) = follower.processes.values()
    assert process.started_mid_file and process.pid == os.getpid() and process.service == "vl-test"
    assert (
        0 < process.requests_completed < 200
        and process.requests[-1].reading[sc.MEM_TORCH_ALLOCATED] == 2 * GiB + 200 * 4 * MiB
    )
    service.request()
    assert service.writer.flush()
    follower.poll()
    assert process.requests[-1].reading[sc.MEM_TORCH_ALLOCATED] == 2 * GiB + 201 * 4 * MiB
    service.writer.close()


@pytest.mark.skipif(not CHILD.exists(), reason="the journal writer's crash child is not in this checkout")
@pytest.mark.parametrize(
    "target", ["journal", "run.jsonl"]
)  # a directory: a file per process; a file: the restart appends
def test_a_killed_writer_is_the_last_crash_and_its_restart_is_followed(tmp_path: Path, target: str):
    journal = tmp_path / target
    follower = JournalFollower(str(journal))
    first = _child("sigkill", journal, stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "ready"  # its records are in the journal (docs/journal.md)
        follower.poll()
        (running,) = live_view(follower).running
        assert running.state.pid == first.pid and running.requests_in_flight == 1
        assert [span.name for span in running.oldest_in_flight] == IN_FLIGHT
    finally:
        first.kill()
        first.wait()
    follower.poll()
    view = live_view(follower)
    assert view.running == [] and view.last_crash.pid == first.pid and view.last_crash.fatal == []
    assert view.last_crash_memory["tensor"] == 7 * GiB  # the sample written just before it was killed
    second = _child("exit", journal)
    assert second.wait(timeout=120) == 0
    follower.poll()
    view = live_view(follower)
    assert [(p.pid, p.clean_end) for p in view.ended] == [(first.pid, False), (second.pid, True)]
    assert view.last_crash.pid == first.pid
    frame = runner.invoke(app, ["top", str(journal), "--once"])
    assert frame.exit_code == 0, frame.output
    assert f"last crash: {view.last_crash.label} stopped without a clean end" in frame.output
    assert f"{view.last_crash.label} (crashed)" in frame.output and "(clean end)" in frame.output


@pytest.mark.skipif(not CHILD.exists(), reason="the journal writer's crash child is not in this checkout")
def test_an_abort_after_rotations_shows_its_chain_and_faulthandler_text(tmp_path: Path):
    """The in-flight spans started in an older file than the last; the stacks follow the zero bytes."""
    journal = tmp_path / "journal"
    child = _child("rotate-abort", journal, stderr=subprocess.DEVNULL)
    assert child.wait(timeout=120) != 0
    assert len(os.listdir(journal)) == 3
    frame = runner.invoke(app, ["top", str(journal), "--once"])
    assert frame.exit_code == 0, frame.output
    follower = JournalFollower(str(journal))
    follower.poll()
    crash = live_view(follower).last_crash
    assert [span.name for span in sorted(crash.in_flight.values(), key=lambda s: s.start_ns)] == IN_FLIGHT
    assert crash.fatal[0] == "Fatal Python error: Aborted"
    assert "Fatal Python error: Aborted" in frame.output and "chat tiny-vl [request]" in frame.output


def test_each_device_has_its_own_outlook_and_an_ended_service_shows_its_last_state(journal):
    """A synthetic two-GPU journal (tests/analysis/synthetic.py) whose tensor leak is on GPU 0 alone."""
    path, _ = journal(
        Scenario(
            requests=150,
            devices=2,
            device_shares=(0.7, 0.3),
            sampled_nvml=True,
            rates={"tensor": 8 * MiB},
            stages={"tensor": sc.STAGE_VISION_FORWARD},
        )
    )
    follower = JournalFollower(str(path.parent))
    follower.poll()
    view = live_view(follower)
    assert view.running == [] and view.last_ended.state.clean_end
    first, second = view.last_ended.devices
    assert (first.name, second.name) == ("GPU 0", "GPU 1")
    assert (
        first.outlook.slope_bytes_per_request == pytest.approx(8 * MiB, rel=0.02) and first.outlook.requests_to_oom > 0
    )
    assert second.outlook.requests_to_oom is None
    frame = runner.invoke(app, ["top", str(path.parent), "--once"])
    assert frame.exit_code == 0 and "ended, as it was at its last record" in frame.output
    assert "Tensor leak" in frame.output and "over the last 100 requests" in frame.output


def test_once_without_a_journal_exits_2(tmp_path: Path):
    missing = runner.invoke(app, ["top", str(tmp_path / "nowhere"), "--once"])
    assert missing.exit_code == 2 and "no journal at" in missing.output
    empty = runner.invoke(app, ["top", str(tmp_path), "--once"])
    assert empty.exit_code == 2 and "no journal records yet" in empty.output
    finished = tmp_path / "run.jsonl.gz"
    finished.write_bytes(gzip.compress(b""))
    compressed = runner.invoke(app, ["top", str(finished)])
    assert compressed.exit_code == 2 and "is a compressed journal" in compressed.output
    assert f"vlmtrace report {finished}" in " ".join(compressed.output.split())
