"""Abort an instrumented process many times: does it die by SIGABRT, soon, with Python's stacks in its journal?

Each run is a fresh process that calls `vlmtrace.instrument()`, starts two threads making spans as fast
as they can (the default 100 ms sampler runs too), and aborts 0.8 s later in one of these ways:
  thread    os.abort() from a thread
  main      os.abort() from the main thread
  ctypes    C abort() through ctypes from a thread
  sleeping  a "native library" installs a SIGABRT handler after vlmtrace that never returns (libc's
            `pause`), then a thread calls os.abort(): vlmtrace's guard must end the process
Each way runs with the default journal, with VLMTRACE_JOURNAL_SYNC=1, and with
VLMTRACE_JOURNAL_MAX_BYTES=1048576 (the journal has rotated before the abort). A run that has not
died after --kill-after-s seconds is killed (SIGKILL): it hung.

    python benchmarks/abort_stress.py --runs 50 --json abort.json
    python benchmarks/abort_stress.py --runs 20 --src /path/to/other/src   # another tree's vlmtrace

Exit status 1 if any run did not die by SIGABRT within --within-s of its abort with stacks in its journal.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

WAYS = ("thread", "main", "ctypes", "sleeping")
JOURNALS = {"default": {}, "sync": {"VLMTRACE_JOURNAL_SYNC": "1"}, "rotate": {"VLMTRACE_JOURNAL_MAX_BYTES": "1048576"}}
ABORT_AFTER_S = 0.8


def child(way: str, journal: str, abort_at_file: str) -> None:
    from opentelemetry import trace

    import vlmtrace

    vlmtrace.instrument(journal=journal)
    tracer = trace.get_tracer("abort-stress")

    def spans() -> None:
        while True:
            with tracer.start_as_current_span("s"):
                pass

    for _ in range(2):
        threading.Thread(target=spans, daemon=True).start()
    libc = ctypes.CDLL(None)
    if way == "sleeping":
        time.sleep(0.3)
        libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
        libc.signal(signal.SIGABRT, ctypes.cast(libc.pause, ctypes.c_void_p))

    def abort() -> None:
        time.sleep(ABORT_AFTER_S)
        with open(abort_at_file, "w") as out:
            out.write(repr(time.time()))
        if way == "ctypes":
            libc.abort()
        os.abort()

    if way == "main":
        abort()
    threading.Thread(target=abort).start()
    while True:
        time.sleep(1)


def _read(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()


def one_run(way: str, journal_kind: str, src: str | None, kill_after_s: float) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        journal, abort_at_file = os.path.join(scratch, "j"), os.path.join(scratch, "abort_at")
        env = {**os.environ, **JOURNALS[journal_kind]}
        if src:
            env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
        process = subprocess.Popen(
            [sys.executable, __file__, "--child", way, journal, abort_at_file],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            _, err = process.communicate(timeout=kill_after_s)
        except subprocess.TimeoutExpired:
            process.kill()
            _, err = process.communicate()
        ended = time.time()
        abort_at = float(_read(abort_at_file)) if os.path.exists(abort_at_file) else None
        stacks = any(
            b"Fatal Python error: Aborted" in _read(path) for path in glob.glob(os.path.join(journal, "*.jsonl"))
        )
    code = process.returncode
    return {
        "way": way,
        "journal": journal_kind,
        "returncode": code,
        "ended_by": signal.Signals(-code).name if code < 0 else f"exit {code}",
        "abort_to_exit_s": None if abort_at is None else round(ended - abort_at, 3),
        "stacks": stacks,
        "stderr_tail": err.decode(errors="replace")[-300:] if code != -signal.SIGABRT else "",
    }


def good(run: dict, within_s: float) -> bool:
    return (
        run["returncode"] == -signal.SIGABRT
        and run["stacks"]
        and run["abort_to_exit_s"] is not None
        and run["abort_to_exit_s"] <= within_s
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=50, help="runs of each way with each journal")
    parser.add_argument("--ways", default=",".join(WAYS))
    parser.add_argument("--journals", default=",".join(JOURNALS))
    parser.add_argument("--within-s", type=float, default=2.0, help="the most seconds from abort to exit")
    parser.add_argument("--kill-after-s", type=float, default=20.0)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--src", help="put this directory first on the children's PYTHONPATH")
    parser.add_argument("--json", help="write every run here")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    plan = [(way, kind) for way in args.ways.split(",") for kind in args.journals.split(",") for _ in range(args.runs)]
    with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
        runs = list(pool.map(lambda item: one_run(*item, args.src, args.kill_after_s), plan))
    failed = 0
    print(f"{'way':9} {'journal':8} {'runs':>4} {'SIGABRT':>7} {'hung':>4} {'stacks':>6} {'max s':>6}  other")
    for way in args.ways.split(","):
        for kind in args.journals.split(","):
            these = [run for run in runs if run["way"] == way and run["journal"] == kind]
            times = [run["abort_to_exit_s"] for run in these if run["abort_to_exit_s"] is not None]
            other = sorted({run["ended_by"] for run in these} - {"SIGABRT"})
            failed += sum(not good(run, args.within_s) for run in these)
            print(
                f"{way:9} {kind:8} {len(these):4} {sum(r['ended_by'] == 'SIGABRT' for r in these):7} "
                f"{sum(r['ended_by'] == 'SIGKILL' for r in these):4} {sum(r['stacks'] for r in these):6} "
                f"{max(times, default=float('nan')):6.2f}  {', '.join(other)}"
            )
    print(f"{failed} of {len(runs)} runs did not die by SIGABRT within {args.within_s} s of the abort with stacks")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"runs": runs, "within_s": args.within_s, "failed": failed}, out, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
