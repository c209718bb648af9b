"""Peak memory and wall time of `vlmtrace report` / `vlmtrace top` on hostile inputs at full size.

The hostile tests (tests/hostile/) run each kind of input small enough for a 2-core CI machine; this
script builds them at the sizes that used to cost gigabytes (a 60 MiB journal of minimal samples, 600k
start records without an end, 8 samples of 250k devices, costly snapshots, a live journal's rotation,
a terabyte sparse hole, 20k one-process files for `top`, 3,000 for `report`, 12M lines of `{}`) and runs each command in a fresh process, measuring the
peak RSS and CPU time of it and the reading processes it forks (RUSAGE_CHILDREN of a wrapper per case). Times are
printed with the machine's load: on a shared machine read them with it. Nothing is asserted.

    PYTHONPATH=src python benchmarks/hostile_memory.py [--only NAME] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
T0 = 1_760_000_000 * 10**9
HEADER = (
    orjson.dumps({"k": "header", "v": 2, "t": T0, "pid": 7, "host": "h", "resource": {"service.name": "lmdeploy"}})
    + b"\n"
)
MEASURE = """
import resource, subprocess, sys, time
started = time.perf_counter()
code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE).returncode
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(code, time.perf_counter() - started, usage.ru_maxrss // 1024, usage.ru_utime + usage.ru_stime)
"""


def _repeated(directory: Path, name: str, line: bytes, total: int) -> list[str]:
    with open(directory / name, "wb") as handle:
        handle.write(HEADER)
        block = line * (MiB // len(line))
        for _ in range(total // len(block)):
            handle.write(block)
    return [name]


def minimal_samples(size: int) -> Callable[[Path], list[str]]:
    return lambda d: _repeated(d, f"samples-{size >> 20}m.jsonl", b'{"k":"sample"}\n', size)


def one_reading_samples(d: Path) -> list[str]:
    line = orjson.dumps({"k": "sample", "t": T0, "attrs": {"vlmtrace.mem.host.rss": 1}}) + b"\n"
    return _repeated(d, "one-reading.jsonl", line, 120 * MiB)


def starts_without_end(d: Path) -> list[str]:
    with open(d / "starts.jsonl", "wb") as handle:
        handle.write(HEADER)
        for index in range(600_000):
            handle.write(
                orjson.dumps(
                    {
                        "k": "start",
                        "t": T0 + index,
                        "trace_id": "a" * 32,
                        "span_id": f"{index + 1:016x}",
                        "name": "request",
                        "kind": "INTERNAL",
                        "thread": "main",
                        "attrs": {"vlmtrace.stage": "request"},
                        "mem": {},
                        "links": [],
                    }
                )
                + b"\n"
            )
    return ["starts.jsonl"]


def many_devices(d: Path) -> list[str]:
    count = 250_000
    sample = (
        orjson.dumps(
            {
                "k": "sample",
                "t": T0,
                "attrs": {
                    "vlmtrace.mem.devices": list(range(count)),
                    "vlmtrace.mem.torch.allocated": 1,
                    "vlmtrace.mem.torch.allocated.per_device": [1] * count,
                },
            }
        )
        + b"\n"
    )
    (d / "devices.jsonl").write_bytes(HEADER + sample * 8)
    return ["devices.jsonl"]


def deep_values(d: Path) -> list[str]:
    deep = b"[" * 1000 + b"]" * 1000
    start = b'{"k":"start","t":%d,"trace_id":"%s","span_id":"%s","name":"x","attrs":{"a":%s}}\n' % (
        T0,
        b"a" * 32,
        b"b" * 16,
        deep,
    )
    header = HEADER[:-2] + b',"argv":' + deep + b"}\n"
    (d / "deep.jsonl").write_bytes(header + b'{"k":"warning","t":1,"source":"p","message":' + deep + b"}\n" + start)
    return ["deep.jsonl"]


def one_process_files(d: Path) -> list[str]:
    """3,000 journal files of one process each, named as the writer names them: 256 are read (the bound on processes)."""
    (d / "journal").mkdir()
    for index in range(3000):
        pid = 2**22 + 1 + index  # above Linux's largest pid: no such process
        header = orjson.dumps({"k": "header", "v": 2, "t": T0, "pid": pid, "host": "elsewhere"}) + b"\n"
        (d / "journal" / f"vlmtrace-elsewhere-{pid}-1.0.jsonl").write_bytes(
            header + b'{"k":"sample","t":%d,"attrs":{"vlmtrace.mem.torch.allocated":1}}\n' % (T0 + index)
        )
    return ["journal"]


def no_kind(header: bool) -> Callable[[Path], list[str]]:
    """12M lines of `{}`: records of no journal kind (after a header) or documents of no format."""

    def build(d: Path) -> list[str]:
        with open(d / "empty.jsonl", "wb") as handle:
            handle.write(HEADER if header else b"")
            for _ in range(12):
                handle.write(b"{}\n" * 1_000_000)
        return ["empty.jsonl"]

    return build


def _snapshot(d: Path, name: str, content: bytes) -> list[str]:
    (d / name).write_bytes(content)
    return [name]


def _segments_dict(value: bytes) -> bytes:
    return b"\x80\x04}(X\x08\x00\x00\x00segments]X\x01\x00\x00\x00x" + value + b"u."


CASES: dict[str, Callable[[Path], list[str]]] = {
    "60 MiB of minimal samples": minimal_samples(60 * MiB),
    "120 MiB of minimal samples": minimal_samples(120 * MiB),
    "120 MiB of one-reading samples": one_reading_samples,
    "600k start records without end": starts_without_end,
    "8 samples of 250k devices": many_devices,
    "values nested 1000 deep": deep_values,
    "3,000 one-process files": one_process_files,
    "12M lines of {}": no_kind(header=False),
    "a header and 12M lines of {}": no_kind(header=True),
    "snapshot: memo index 2**32-1": lambda d: _snapshot(
        d, "memo.pickle", b"\x80\x04]r\xff\xff\xff\xff0" + _segments_dict(b"N")[2:]
    ),
    "snapshot: 7 MB of empty sets": lambda d: _snapshot(
        d, "sets.pickle", _segments_dict(b"(" + b"\x8f" * (7 << 20) + b"l")
    ),
    "snapshot: 1M nested 1-tuples as a key": lambda d: _snapshot(
        d, "tuples.pickle", _segments_dict(b"}N" + b"\x85" * 1_000_000 + b"Ns")
    ),
    "snapshot: 60k colliding keys, --max cpu-seconds=5": lambda d: (
        [
            *_snapshot(
                d,
                "collide.pickle",
                pickle.dumps({"segments": [], "x": {k * (2**61 - 1): 0 for k in range(1, 60000)}}, protocol=4),
            ),
            "--max",
            "cpu-seconds=5",
        ]
    ),
    "snapshot: 20k blocks of 16 frames (a real one's shape)": lambda d: _snapshot(
        d,
        "real.pickle",
        pickle.dumps(
            {
                "segments": [
                    {
                        "device": 0,
                        "total_size": 1 << 40,
                        "blocks": [
                            {
                                "size": 512,
                                "state": "active_allocated",
                                "frames": [
                                    {"filename": f"/srv/app/f{j}.py", "line": j, "name": f"fn{j}"} for j in range(16)
                                ],
                            }
                            for _ in range(100)
                        ],
                    }
                    for _ in range(200)
                ]
            },
            protocol=4,
        ),
    ),
}


def _sparse_top(d: Path) -> list[str]:
    (d / "journal").mkdir()
    with open(d / "journal" / "s.jsonl", "wb") as handle:
        handle.write(HEADER)
        handle.truncate(1 << 40)
    return ["journal"]


def _many_files_top(d: Path) -> list[str]:
    (d / "journal").mkdir()
    for index in range(20_000):
        header = orjson.dumps({"k": "header", "v": 2, "t": T0, "pid": 100 + index, "host": "elsewhere"}) + b"\n"
        (d / "journal" / f"vlmtrace-elsewhere-{100 + index}-1.0.jsonl").write_bytes(
            header + b'{"k":"sample","t":%d}\n' % (T0 + index)
        )
    return ["journal"]


TOP_CASES = {"top: a header and a 1 TiB sparse hole": _sparse_top, "top: 20k one-process files": _many_files_top}


def run(command: list[str], cwd: Path) -> dict:
    environment = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    output = subprocess.run(
        [sys.executable, "-c", MEASURE, sys.executable, "-m", "vlmtrace", *command],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=900,
    ).stdout.split()
    code, wall, peak, cpu = output
    return {
        "exit": int(code),
        "wall_s": round(float(wall), 1),
        "cpu_s": round(float(cpu), 1),
        "peak_rss_mib": int(peak),
        "load": round(os.getloadavg()[0], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="run the cases whose name contains this")
    parser.add_argument("--out", type=Path)
    options = parser.parse_args()
    results = {}
    for name, build in [*CASES.items(), *TOP_CASES.items()]:
        if options.only and options.only not in name:
            continue
        with tempfile.TemporaryDirectory() as directory:
            arguments = build(Path(directory))
            command = (
                ["top", "--once", *arguments]
                if name in TOP_CASES
                else ["report", *arguments, "-o", "r.html", "--json", "s.json"]
            )
            results[name] = run(command, Path(directory))
        print(f"{name:60s} {results[name]}", flush=True)
    if options.out:
        options.out.parent.mkdir(parents=True, exist_ok=True)
        options.out.write_text(
            json.dumps(
                {
                    "command": "PYTHONPATH=src python " + " ".join(sys.argv),
                    "machine": f"{platform.node()}: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, Python {platform.python_version()}",
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "results": results,
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
