"""vlmtrace's work at real requests' span boundaries, part by part, on LMDeploy's event-loop thread.

    PYTHONPATH=src:. python benchmarks/request_in_place.py [--seconds 40] [--mode infer|stream] [--json PATH]

Requests run one at a time through LMDeploy 0.18's real pipeline over the test suite's stand-in TurboMind
engine (one 224x224 image, 16 new tokens), under `instrument()`'s defaults (journal on, no SDK). Two
phases of `--seconds` each:

- **parts**: each part of vlmtrace's work is timed where it runs, by the thread's CPU clock: span starts
  and span ends (each with its memory reading and journal record), memory readings (those inside starts
  and ends, and the reading at the prompt's end), and each attribute extraction. Only calls on the
  event-loop thread count (the pipeline span's start and end run on the caller's thread). Per request:
  the calls and their CPU, and a part's median call.
- **reads**: at each boundary's host-memory read, one of four reads runs twice, chosen at random: the
  first run is cold (the loop has just woken from its poll), the second warm. vlmtrace's read (the
  compiled core's `statm_rss`, holding the GIL), the read without the core (libc's pread through ctypes,
  holding the GIL, and Python's parse), `os.pread` (which lets go of the GIL in the system call), and a
  clock read with no system call (`time.time_ns`, the vDSO): what timing anything there costs.

`request_budget.py` measures what all of it adds to a request; `request_replay.py` what the same work
costs run warm, in a tight loop.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from request_budget import EXTRACTING_MODULES, stand_in_pipeline
from tests.support.cpu_lmdeploy import cpu_lmdeploy

import vlmtrace
from vlmtrace import compiled
from vlmtrace.instrumentation import runtime
from vlmtrace.probes import host as probes_host
from vlmtrace.probes import memory

PARTS = (
    ("span starts", runtime.Telemetry, "start"),
    ("span ends", runtime.SpanHandle, "end"),
    ("memory readings", memory.MemoryProbe, "read"),
)


def _median_us(values: list[int]) -> float:
    return round(sorted(values)[len(values) // 2] / 1e3, 1) if values else 0.0


class LoopTimings:
    """CPU per call of each timed part, counted only on the event-loop thread."""

    def __init__(self, loop_thread: int) -> None:
        self.loop_thread = loop_thread
        self.calls: dict[str, list[int]] = collections.defaultdict(list)

    def timed(self, part: str, function: Callable) -> Callable:
        calls, loop_thread = self.calls[part], self.loop_thread

        def call(*args, **kwargs):
            if threading.get_ident() != loop_thread:
                return function(*args, **kwargs)
            began = time.thread_time_ns()
            try:
                return function(*args, **kwargs)
            finally:
                calls.append(time.thread_time_ns() - began)

        return call

    def timed_safe(self, safe: Callable) -> Callable:
        """`runtime.safe`, timed under the name of the extraction it runs."""
        by_extraction: dict[Callable, Callable] = {}

        def call(extract, *args):
            timed = by_extraction.get(extract)
            if timed is None:
                timed = by_extraction[extract] = self.timed(f"attributes: {extract.__name__}", safe)
            return timed(extract, *args)

        return call

    def reset(self) -> None:
        for values in self.calls.values():
            values.clear()

    def summary(self, requests: int) -> dict:
        return {
            part: {
                "calls_per_request": round(len(values) / requests, 2),
                "us_per_request": round(sum(values) / requests / 1e3, 1),
                "median_call_us": _median_us(values),
            }
            for part, values in sorted(self.calls.items())
            if values
        }


def run_for(
    seconds: float, one: Callable[[str], None], mode: str, after_warm_up: Callable[[], None] = lambda: None
) -> int:
    """Requests for `seconds` after ten that warm up (the first after instrument() pay its start-up); how many."""
    for _ in range(10):
        one(mode)
    after_warm_up()
    requests = 0
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        one(mode)
        requests += 1
    return requests


def parts(seconds: float, mode: str, detail_every: int = 1) -> dict:
    """`detail_every` above 1: with stage detail sampled, past the young requests (1 in K records its detail)."""
    with cpu_lmdeploy(token_seconds=0.001):
        pipe, one = stand_in_pipeline()
        timings = LoopTimings(pipe.internal_thread.thread.ident)
        saved = [(owner, name, owner.__dict__[name]) for _, owner, name in PARTS]
        saved += [(module, "safe", module.safe) for module in EXTRACTING_MODULES]
        for part, owner, name in PARTS:
            setattr(owner, name, timings.timed(part, owner.__dict__[name]))
        for module in EXTRACTING_MODULES:
            module.safe = timings.timed_safe(module.safe)
        try:
            session = vlmtrace.instrument(journal=tempfile.mkdtemp(), detail_every=detail_every)
            if session.telemetry.detail is not None:
                session.telemetry.detail.young = 0
            requests = run_for(seconds, one, mode, timings.reset)
            vlmtrace.uninstrument()
        finally:
            for owner, name, original in saved:
                setattr(owner, name, original)
            pipe.close()
    found = timings.summary(requests)
    extraction = [values for part, values in found.items() if part.startswith("attributes: ")]
    found["attributes (all)"] = {"us_per_request": round(sum(v["us_per_request"] for v in extraction), 1)}
    return {"requests": requests, "parts": found}


def reads(seconds: float, mode: str) -> dict:
    with cpu_lmdeploy(token_seconds=0.001):
        pipe, one = stand_in_pipeline()
        session = vlmtrace.instrument(journal=tempfile.mkdtemp())
        host = session.telemetry.probe._host
        ours, statm, page = host.rss_on_request_path, host._statm, os.sysconf("SC_PAGE_SIZE")
        buffer = ctypes.create_string_buffer(probes_host.STATM_BYTES)
        libc_pread = probes_host._libc_pread(statm, buffer)

        def ctypes_read() -> int:
            libc_pread()
            return int(buffer.value.split(None, 2)[1]) * page

        variants = {
            "ctypes pread (without the core)": ctypes_read,
            "os.pread": lambda: int(os.pread(statm, 128, 0).split()[1]),
            "clock only (vDSO)": time.time_ns,
        }
        core = compiled.core()
        if core is not None:
            variants["compiled core (statm_rss)"] = lambda: core.statm_rss(statm, page)
        cold: dict[str, list[int]] = collections.defaultdict(list)
        warm: dict[str, list[int]] = collections.defaultdict(list)
        names = list(variants)

        def timed() -> int:
            name = random.choice(names)
            read = variants[name]
            began = time.thread_time_ns()
            read()
            between = time.thread_time_ns()
            read()
            cold[name].append(between - began)
            warm[name].append(time.thread_time_ns() - between)
            return ours()

        host.rss_on_request_path = timed
        try:
            requests = run_for(seconds, one, mode)
        finally:
            vlmtrace.uninstrument()
            pipe.close()
    return {
        "requests": requests,
        "reads": {
            name: {"cold_us": _median_us(cold[name]), "warm_us": _median_us(warm[name]), "boundaries": len(cold[name])}
            for name in names
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=("infer", "stream"), default="infer")
    parser.add_argument("--seconds", type=float, default=40.0, help="requests per phase, in seconds")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument(
        "--detail-every", type=int, default=1, metavar="K", help="also time the parts with detail_every=K (past young)"
    )
    args = parser.parse_args()
    result = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.uname().machine}, {os.cpu_count()} CPUs, python {sys.version.split()[0]}",
        "mode": args.mode,
        "parts": parts(args.seconds, args.mode),
        "reads": reads(args.seconds, args.mode),
    }
    if args.detail_every > 1:
        result[f"parts_detail_every_{args.detail_every}"] = parts(args.seconds, args.mode, args.detail_every)
    for key in [key for key in result if key.startswith("parts")]:
        print(f"{args.mode} ({key}): µs of event-loop CPU per request, by part ({result[key]['requests']} requests)")
        for part, values in result[key]["parts"].items():
            calls = values.get("calls_per_request")
            print(
                f"  {part:40} {values['us_per_request']:7.1f}"
                + (f"   {calls:4.1f} calls, median {values['median_call_us']:5.1f}" if calls is not None else "")
            )
    print(f"host-memory read at a boundary, median µs of CPU ({result['reads']['requests']} requests)")
    for name, values in result["reads"]["reads"].items():
        print(
            f"  {name:40} cold {values['cold_us']:5.1f}   warm {values['warm_us']:5.1f}"
            f"   ({values['boundaries']} boundaries)"
        )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)


if __name__ == "__main__":
    main()
