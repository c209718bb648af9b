"""The compiled read of torch's allocator counters (probes/native_counters.py), on a CPU machine: it is
built from the real torch headers and loaded, it declines without a CUDA device and leaves readings on
the Python path, a built library is reused, and what `doctor` says. Its agreement with torch's own dict
on a GPU is benchmarks/native/torch_stats_probe.py's (50 of 50 on the H200, docs/performance.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vlmtrace.config import Options
from vlmtrace.probes import native_counters
from vlmtrace.probes.native_counters import (
    NativeCounters,
    has_generic_allocator,
    readiness,
)
from vlmtrace.probes.torch_allocator import TorchAllocatorProbe, TorchReading

torch = pytest.importorskip("torch")
TORCH_DIR = Path(torch.__file__).parent
# What the library is checked against; never reached on a CPU, where the device read fails first.
UNREACHED = TorchAllocatorProbe().read_from_torch


@pytest.mark.parametrize("way_in", ["c10", "c10::cuda"])
def test_the_library_is_built_outside_the_process_and_declines_without_a_cuda_device(tmp_path, monkeypatch, way_in):
    """Built by `vlmtrace doctor --build` or `vlmtrace run` (native_counters.build), through c10's device-generic
    allocator (this torch has it: no CUDA header needed), and through c10::cuda as with older torch (CUDA's
    headers from the nvidia-* wheels); an instrumented process only loads it."""
    assert has_generic_allocator(TORCH_DIR)
    if way_in == "c10::cuda":
        monkeypatch.setattr(native_counters, "has_generic_allocator", lambda torch_dir: False)
    monkeypatch.setenv("VLMTRACE_CACHE_DIR", str(tmp_path))
    library = native_counters.build()
    assert list(tmp_path.iterdir()) == [library] and library.suffix == ".so"  # built whole, no partial left
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    assert native_counters.build() == library  # a built library needs no compiler
    counters = NativeCounters(torch, UNREACHED)
    counters.start()
    assert counters.wait(120) == "unavailable: the compiled read failed (no CUDA device?)"
    assert counters.read(0) is None  # readings stay on the Python path


def test_an_instrumented_process_never_builds_it(tmp_path, monkeypatch):
    """Not built for this torch: the process reads torch's counters through Python, runs no compiler and
    writes nothing."""
    monkeypatch.setenv("VLMTRACE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(native_counters, "compile_library", lambda *args, **kwargs: pytest.fail("a compiler ran"))
    counters = NativeCounters(torch, UNREACHED)
    counters.start()
    assert counters.wait(120).startswith("unavailable: not built for this torch (`vlmtrace doctor --build`")
    assert counters.read(0) is None and list(tmp_path.iterdir()) == []


def test_a_failed_build_leaves_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("VLMTRACE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    with pytest.raises(OSError):
        native_counters.build()
    assert list(tmp_path.iterdir()) == []


def test_the_probe_takes_the_compiled_counters_when_they_are_ready():
    probe = TorchAllocatorProbe()

    class Ready:
        state = "ready"

        def read(self, ordinal: int) -> tuple[int, ...]:
            return (1, 2, 3, 4, 5)

    probe.native = Ready()
    assert probe.read(0) == TorchReading(1, 2, 3, 4, 5)


def test_it_is_on_by_default_and_can_be_turned_off():
    assert Options.resolve(environ={}).native_counters is True
    assert Options.resolve(environ={"VLMTRACE_NATIVE_COUNTERS": "0"}).native_counters is False
    assert TorchAllocatorProbe().native_state == "off"
    assert readiness(TORCH_DIR, enabled=False).startswith("off")


def test_doctor_says_whether_it_is_built_and_why_it_cannot_be(monkeypatch, tmp_path):
    monkeypatch.setenv("VLMTRACE_CACHE_DIR", str(tmp_path / "cache"))
    assert readiness(TORCH_DIR).startswith("Python path until built: `vlmtrace doctor --build`")  # g++, c10's headers
    native_counters.library_path(TORCH_DIR).parent.mkdir()
    native_counters.library_path(TORCH_DIR).write_bytes(b"")
    assert readiness(TORCH_DIR).startswith("compiled read: built for this torch")
    monkeypatch.setenv("VLMTRACE_CACHE_DIR", str(tmp_path / "empty"))
    monkeypatch.setattr(native_counters, "has_generic_allocator", lambda torch_dir: False)
    assert readiness(TORCH_DIR).startswith("Python path until built")  # older torch: the crt wheel's headers are here
    monkeypatch.setattr(native_counters, "include_dirs", lambda torch_dir: [str(torch_dir / "include")])
    assert readiness(TORCH_DIR).startswith("Python path: cuda_runtime_api.h, crt/host_defines.h not found")
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert readiness(TORCH_DIR) == "Python path: no C++ compiler (g++, c++ or $CXX)"


def test_a_load_under_way_in_the_parent_starts_again_in_a_forked_child(tmp_path, monkeypatch):
    """A child has no copy of the parent's loading thread: its instance goes back to not started, so the
    next reading's start() loads it there."""
    import os

    monkeypatch.setenv("VLMTRACE_CACHE_DIR", str(tmp_path))
    counters = NativeCounters(torch, UNREACHED)
    counters.state, counters._started = "loading", True
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write_end, counters.state.encode())
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read_end, 100) == b"not started"


def test_the_fresh_process_benchmark_records_which_read_each_process_took(monkeypatch):
    """benchmarks/gpu_overhead_processes.py: each instrumented process says whether its readings took the
    compiled read or torch's dict (the JSON of a fresh process could not tell them apart by its CPU time
    alone), and the summary counts them."""
    import importlib
    from types import SimpleNamespace

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    benchmark = importlib.import_module("gpu_overhead_processes")
    probe = TorchAllocatorProbe(native=True)
    session = SimpleNamespace(probe=SimpleNamespace(torch_allocator=probe))
    assert benchmark.torch_counter_path(None) is None
    assert benchmark.torch_counter_path(SimpleNamespace(probe=SimpleNamespace(torch_allocator=None))) is None
    monkeypatch.setattr(probe, "active", lambda: False)
    assert benchmark.torch_counter_path(session) is None  # CUDA not up: torch's counters not read
    monkeypatch.setattr(probe, "active", lambda: True)
    probe.native = SimpleNamespace(state="building")
    assert benchmark.torch_counter_path(session) == "python"
    probe.native = SimpleNamespace(state="unavailable: no C++ compiler (g++, c++ or $CXX)")
    assert benchmark.torch_counter_path(session) == "python"
    probe.native = SimpleNamespace(state="ready")
    assert benchmark.torch_counter_path(session) == "native"

    def process(arm, median_ms, path=None):
        counted = {"memory_reads_per_batch": 18.0, "torch_counters": path} if arm != "plain" else {}
        return {
            "median_ms": median_ms,
            "p95_ms": median_ms,
            "prompts_per_s": 10.0,
            "build_s": 30.0,
            "latencies_ms": [median_ms] * 3,
            "event_loop_cpu_ms_per_batch": median_ms / 10,
            "process_cpu_ms_per_batch": median_ms,
            **counted,
        }

    pairs = [
        benchmark.pair_result(
            index,
            ["plain", "vlmtrace"],
            {"plain": process("plain", 100.0), "vlmtrace": process("vlmtrace", 101.0, path)},
        )
        for index, path in enumerate(["native", "native", "mixed", "python", None])
    ]
    summary = benchmark.summary(pairs, ["plain", "vlmtrace"])
    assert summary["vlmtrace"]["torch_counters"] == {"native": 2, "mixed": 1, "python": 1, "not read": 1}
    assert "torch_counters" not in summary["plain"]
