"""Abort to exit, plain LMDeploy against the same under vlmtrace: does vlmtrace change how soon an aborted VLM process dies?

    python3 benchmarks/gpu_abort_exit.py run OUT --backends turbomind,pytorch --runs 3 --deadline 540
    python3 benchmarks/gpu_abort_exit.py analyse OUT      # where the report extra is installed
    python3 benchmarks/gpu_abort_exit.py run OUT --backends turbomind --runs 2 --standin   # on a CPU

`run`: per backend and run, one fresh process per arm (`plain`; `vlmtrace`: `vlmtrace.instrument(journal=
OUT/journals/BACKEND-vlmtrace-RUN)` before the pipeline is built), the arms' order alternating run by run.
Each process builds the tiny-VLM pipeline, runs one batch of image prompts, then keeps running batches
while a thread, --abort-after-s later, prints the abort's CLOCK_MONOTONIC and wall-clock times (flushed)
and calls os.abort(). This process times the child from that monotonic time (one clock for every process
of a host) to its exit, reads its exit status (death by SIGABRT is -6), and kills the child's process
group --kill-after-s after the abort if it is still there, and says so (`killed`). Every child also
reports the core-dump limit and pattern (a core dump is part of the time to exit, in both arms alike)
and the owners of the fatal-signal handlers in place before the abort. OUT/result.json is rewritten
after every process; no run starts that the slowest so far says would end after --deadline seconds.

`analyse`: `vlmtrace report` (the JSON summary) on each vlmtrace arm's journal: how each process ended,
the spans in flight and whether the fatal signal's stacks are there; adds them to OUT/result.json.
Exit status 0 when every backend's vlmtrace median is within 2 s of plain's and no child was killed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ARMS = ("plain", "vlmtrace")


def child(backend: str, arm: str, journal: str, abort_after_s: float, standin: bool) -> None:
    import contextlib

    from workload import batches, build_pipeline, generation_config

    engine = contextlib.nullcontext()
    if standin:
        sys.path.insert(0, str(HERE.parent))
        from tests.support.cpu_lmdeploy import cpu_lmdeploy, tiny_vlm_path

        os.environ.setdefault("VLMTRACE_TINY_VLM", tiny_vlm_path())
        engine = cpu_lmdeploy(token_seconds=0.0005)
    with engine:
        if arm == "vlmtrace":
            import vlmtrace

            vlmtrace.instrument(journal=journal, service_name=f"tiny-vlm-{backend}")
        started = time.monotonic()
        pipe = build_pipeline(backend, max_batch_size=16)
        gen = generation_config(max_new_tokens=64)
        work = [p for batch in batches(16, seed=5, max_prompts=1) for p in batch.prompts()]
        pipe(work[:4], gen_config=gen)
        built_s = time.monotonic() - started

        def abort() -> None:
            time.sleep(abort_after_s)
            from vlmtrace.export import fatal_signals

            actions = fatal_signals.installed()
            print(
                json.dumps(
                    {
                        "aborting": True,
                        "monotonic": time.monotonic(),
                        "wall": time.time(),
                        "built_s": round(built_s, 2),
                        "fatal_signal_handlers": fatal_signals.owners(actions),
                        "sigabrt_handler": fatal_signals.owners({signal.SIGABRT: actions[signal.SIGABRT]}),
                        "core_limit": resource.getrlimit(resource.RLIMIT_CORE),
                    }
                ),
                flush=True,
            )
            os.abort()

        threading.Thread(target=abort, name="abort-injector", daemon=True).start()
        while True:
            pipe(work, gen_config=gen)


def one_process(args, backend: str, arm: str, index: int) -> dict:
    journal = args.out / "journals" / f"{backend}-{arm}-{index}"
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "child",
        "--backend",
        backend,
        "--arm",
        arm,
        "--journal",
        str(journal),
        "--abort-after-s",
        str(args.abort_after_s),
    ] + (["--standin"] * args.standin)
    environment = dict(os.environ, PYTHONUNBUFFERED="1")
    if args.fresh_triton_cache:  # Triton compiles in the child, and loads libtriton's fatal-signal handlers
        environment["TRITON_CACHE_DIR"] = str(args.out / "triton-cache" / f"{backend}-{arm}-{index}")
    started = time.monotonic()
    with open(args.out / "logs" / f"{backend}-{arm}-{index}.log", "wb") as log:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, start_new_session=True, env=environment)
        holder: list[dict] = []
        reader = threading.Thread(target=_read_abort, args=(process, holder), daemon=True)
        reader.start()
        killed = False
        while process.poll() is None:  # exit time to within this loop's 5 ms
            bound = holder[0]["monotonic"] + args.kill_after_s if holder else started + args.start_timeout_s
            if time.monotonic() > bound:
                os.killpg(process.pid, signal.SIGKILL)
                killed = True
                process.wait()
                break
            time.sleep(0.005)
        exited = time.monotonic()
        reader.join(5)
    line = holder[0] if holder else None
    leftover = _group_alive(process.pid)  # the engine's own processes, left behind by the abort
    if leftover:
        os.killpg(process.pid, signal.SIGKILL)
    status = process.returncode
    return {
        "backend": backend,
        "arm": arm,
        "run": index,
        "journal": str(journal) if arm == "vlmtrace" else None,
        "exit_status": status,
        "signal": signal.Signals(-status).name if status and status < 0 else None,
        "killed": killed,
        "aborted": line is not None,
        "abort_to_exit_s": round(exited - line["monotonic"], 3) if line else None,
        "process_s": round(exited - started, 2),
        "built_s": line and line["built_s"],
        "abort_wall": line and line["wall"],
        "fatal_signal_handlers": line and line["fatal_signal_handlers"],
        "sigabrt_handler": line and line["sigabrt_handler"],
        "core_limit": line and line["core_limit"],
        "group_left_running": leftover,
    }


def _read_abort(process: subprocess.Popen, holder: list) -> None:
    """Reads the child's stdout to its end and keeps its abort line."""
    for raw in process.stdout:
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("aborting") and not holder:
            holder.append(record)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def summarise(result: dict) -> dict:
    by_backend: dict = {}
    for backend in result["backends"]:
        rows = [r for r in result["processes"] if r["backend"] == backend]
        arms = {}
        for arm in ARMS:
            times = [r["abort_to_exit_s"] for r in rows if r["arm"] == arm and r["abort_to_exit_s"] is not None]
            arms[arm] = {
                "abort_to_exit_s": times,
                "median_s": statistics.median(times) if times else None,
                "exit_statuses": [r["exit_status"] for r in rows if r["arm"] == arm],
                "killed": sum(r["killed"] for r in rows if r["arm"] == arm),
            }
        plain, traced = arms["plain"]["median_s"], arms["vlmtrace"]["median_s"]
        difference = round(traced - plain, 3) if plain is not None and traced is not None else None
        by_backend[backend] = {
            **arms,
            "vlmtrace_minus_plain_s": difference,
            "within_2s": difference is not None
            and difference <= 2.0
            and not arms["plain"]["killed"]
            and not arms["vlmtrace"]["killed"],
        }
    return by_backend


def write(args, result: dict) -> None:
    result["summary"] = summarise(result)
    (args.out / "result.json").write_text(json.dumps(result, indent=1) + "\n")


def run(args) -> int:
    (args.out / "logs").mkdir(parents=True, exist_ok=True)
    result = {
        "command": " ".join(sys.argv),
        "backends": args.backends,
        "abort_after_s": args.abort_after_s,
        "kill_after_s": args.kill_after_s,
        "core_pattern": _core_pattern(),
        "processes": [],
    }
    began, slowest = time.monotonic(), 0.0
    for index in range(args.runs):
        for backend in args.backends:
            arms = ARMS if index % 2 == 0 else ARMS[::-1]
            for arm in arms:
                if args.deadline and time.monotonic() - began + slowest > args.deadline:
                    result["cut_short"] = f"no process started that would end after {args.deadline} s"
                    write(args, result)
                    return report(result)
                started = time.monotonic()
                row = one_process(args, backend, arm, index)
                slowest = max(slowest, time.monotonic() - started)
                result["processes"].append(row)
                print(json.dumps(row), flush=True)
                write(args, result)
    return report(result)


def _core_pattern() -> str | None:
    try:
        return Path("/proc/sys/kernel/core_pattern").read_text().strip()
    except OSError:
        return None


def analyse(args) -> int:
    result = json.loads((args.out / "result.json").read_text())
    for row in result["processes"]:
        if not row["journal"]:
            continue
        journal = args.out / "journals" / Path(row["journal"]).name  # where it was unpacked
        summary_path = journal.with_suffix(".summary.json")
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "vlmtrace",
                "report",
                str(journal),
                "-o",
                str(journal.with_suffix(".html")),
                "--json",
                str(summary_path),
            ],
            check=False,
            capture_output=True,
            text=True,
        )
        if not summary_path.exists():
            row["journal_report"] = {"exit": done.returncode, "error": done.stderr[-400:]}
            continue
        summary = json.loads(summary_path.read_text())
        crash = summary.get("crash") or []
        row["journal_report"] = {
            "exit": done.returncode,
            "ended": [p["ended"] for p in summary["processes"] if p.get("journal")],
            "crashed": summary.get("crashed"),
            "in_flight_spans": len(summary.get("in_flight") or []),
            "in_flight_requests": summary.get("requests", 0) - summary.get("requests_completed", 0),
            "fatal_stacks": sum(len(f.get("threads") or []) for item in crash for f in item["fatal"]),
            "fatal_titles": [f["title"] for item in crash for f in item["fatal"]],
        }
    write(args, result)
    return report(result)


def report(result: dict) -> int:
    for backend, rows in result["summary"].items():
        print(
            backend,
            json.dumps(
                {
                    arm: {k: rows[arm][k] for k in ("abort_to_exit_s", "median_s", "exit_statuses", "killed")}
                    for arm in ARMS
                }
            ),
            "vlmtrace-plain",
            rows["vlmtrace_minus_plain_s"],
            "s",
            "ok" if rows["within_2s"] else "NOT within 2 s",
        )
    return 0 if result["summary"] and all(rows["within_2s"] for rows in result["summary"].values()) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    running = commands.add_parser("run")
    running.add_argument("out", type=Path)
    running.add_argument("--backends", type=lambda text: text.split(","), default=["turbomind", "pytorch"])
    running.add_argument("--runs", type=int, default=3)
    running.add_argument("--abort-after-s", type=float, default=1.0, help="after the first batch's end")
    running.add_argument("--kill-after-s", type=float, default=60.0, help="after the abort")
    running.add_argument("--start-timeout-s", type=float, default=240.0, help="from the start to the abort line")
    running.add_argument("--deadline", type=float, default=0.0, help="seconds; 0: none")
    running.add_argument(
        "--fresh-triton-cache",
        action="store_true",
        help="an empty TRITON_CACHE_DIR per process: every process compiles its Triton kernels",
    )
    running.add_argument("--standin", action="store_true", help="CPU: the stand-in TurboMind engine (tests/support)")
    analysing = commands.add_parser("analyse")
    analysing.add_argument("out", type=Path)
    aborting = commands.add_parser("child")
    aborting.add_argument("--backend", required=True)
    aborting.add_argument("--arm", choices=ARMS, required=True)
    aborting.add_argument("--journal", required=True)
    aborting.add_argument("--abort-after-s", type=float, required=True)
    aborting.add_argument("--standin", action="store_true")
    args = parser.parse_args()
    if args.command == "child":
        sys.path.insert(0, str(HERE))
        child(args.backend, args.arm, args.journal, args.abort_after_s, args.standin)
        return 0
    args.out = args.out.resolve()
    return run(args) if args.command == "run" else analyse(args)


if __name__ == "__main__":
    sys.exit(main())
