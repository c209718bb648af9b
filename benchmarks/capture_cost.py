"""What capture costs on the CPU pipeline: LMDeploy 0.18's real pipeline on the stand-in TurboMind, a host
leak kept by the vision encoder's preprocessing at every request, recorded with `capture=auto` and with
`capture=off`, each run in a fresh process, the arms alternated.

    python benchmarks/capture_cost.py [--pairs 3] [--requests 960] [--window 64] [--json out.json]

A run is an hour scaled down: `--requests` requests at 4 in flight, of which one capture window
(`--window` request ends, tracemalloc on) opens where the live rule suspects the host growth. The
leak is 256 KiB a request: twice the host floor, so the rule suspects it after ~40 requests. Each process
times its requests only (the pipeline is built and warmed first); the result is the median over pairs of
the wall-time ratio auto/off, the window's own cost (per request inside the window against outside it,
in the auto runs), and whether the window named the leak's line first.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
LEAK_BYTES = 256 * 1024
IN_FLIGHT = 4
WARM_REQUESTS = 16


def child(mode: str, requests: int, window: int, journal: str) -> dict:
    """One run in this process; its timings."""
    sys.path.insert(0, REPO)
    from lmdeploy import GenerationConfig
    from lmdeploy.vl.engine import ImageEncoder
    from tests.support.cpu_lmdeploy import cpu_lmdeploy, standin_pipeline
    from tests.support.spans import image

    import vlmtrace

    kept: list = []
    original = ImageEncoder.preprocess

    async def preprocess(encoder, *args, **kwargs):
        kept.append(bytearray(LEAK_BYTES))  # the leak
        return await original(encoder, *args, **kwargs)

    ImageEncoder.preprocess = preprocess
    from vlmtrace.export.journal.writer import JournalWriter

    captures: list = []  # kept as written: the journal rotates its first files away (16 MiB x 4 kept)
    write_capture = JournalWriter.write_capture
    JournalWriter.write_capture = lambda writer, record: (captures.append(record), write_capture(writer, record))[1]
    from vlmtrace.capture.controller import CaptureController

    sampler_s = [0.0]  # the controller's own time on the sampler's thread: the live rule, opening, closing
    on_sample = CaptureController.on_sample

    def timed_on_sample(controller, t_ns, reading):
        began = time.perf_counter()
        on_sample(controller, t_ns, reading)
        sampler_s[0] += time.perf_counter() - began

    CaptureController.on_sample = timed_on_sample
    with cpu_lmdeploy():
        vlmtrace.instrument(
            journal=journal,
            capture=mode,
            capture_window_requests=window,
            metrics=False,
            journal_max_bytes=16 << 20,
            journal_max_files=4,
        )
        pipe = standin_pipeline()
        gen = GenerationConfig(max_new_tokens=4, top_k=1)
        prompts = [("describe this image", image(64 + 8 * (i % 5), 48, i)) for i in range(IN_FLIGHT)]
        for _ in range(WARM_REQUESTS // IN_FLIGHT):
            pipe(prompts, gen_config=gen)
        import tracemalloc

        calls, in_window = [], []
        started = time.perf_counter()
        for _ in range(requests // IN_FLIGHT):
            began = time.perf_counter()
            pipe(prompts, gen_config=gen)
            calls.append(time.perf_counter() - began)
            in_window.append(tracemalloc.is_tracing())
        wall = time.perf_counter() - started
        pipe.close()
        vlmtrace.uninstrument()
    shutil.rmtree(journal, ignore_errors=True)
    inside = [seconds for seconds, tracing in zip(calls, in_window) if tracing]
    outside = [seconds for seconds, tracing in zip(calls, in_window) if not tracing]
    first = captures[0]["sites"][0] if captures and captures[0]["sites"] else None
    return {
        "mode": mode,
        "wall_s": wall,
        "controller_s": sampler_s[0],
        "calls_in_window_s": sum(inside),
        "calls": len(calls),
        "calls_in_window": len(inside),
        "call_s_in_window": statistics.median(inside) if inside else None,
        "call_s_outside": statistics.median(outside) if outside else None,
        "windows": len(captures),
        "first_site": f"{os.path.basename(first['file'])}:{first['line']} in {first['function']}" if first else None,
        "first_site_bytes_per_request": first["bytes_per_request"] if first else None,
    }


def _run(mode: str, requests: int, window: int, journal: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "src"), REPO])}
    done = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            mode,
            "--requests",
            str(requests),
            "--window",
            str(window),
            "--journal",
            journal,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"the {mode} run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=960)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--json")
    parser.add_argument("--child", choices=("auto", "off"))
    parser.add_argument("--journal")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.requests, args.window, args.journal)))
        return
    import tempfile

    runs = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as work:
        for pair in range(args.pairs):
            order = ("off", "auto") if pair % 2 == 0 else ("auto", "off")
            done = {
                mode: _run(mode, args.requests, args.window, os.path.join(work, f"{pair}-{mode}")) for mode in order
            }
            runs.append(
                {"auto": done["auto"], "off": done["off"], "ratio": done["auto"]["wall_s"] / done["off"]["wall_s"]}
            )
            print(
                f"pair {pair}: auto {done['auto']['wall_s']:.2f} s, off {done['off']['wall_s']:.2f} s, "
                f"ratio {runs[-1]['ratio']:.3f}, windows {done['auto']['windows']}, first site {done['auto']['first_site']}",
                flush=True,
            )
    outside_costs = [
        run["auto"]["call_s_outside"] / run["off"]["call_s_outside"] for run in runs if run["auto"]["call_s_outside"]
    ]
    window_costs = [
        run["auto"]["call_s_in_window"] / run["auto"]["call_s_outside"]
        for run in runs
        if run["auto"]["call_s_in_window"] and run["auto"]["call_s_outside"]
    ]
    result = {
        "command": " ".join(["python", "benchmarks/capture_cost.py", *sys.argv[1:]]),
        "machine": f"{platform.node()}: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, Python {platform.python_version()}",
        "load_average_before_after": [load_before, os.getloadavg()],  # a shared machine's A/B ratio is its load's
        "requests": args.requests,
        "window_requests": args.window,
        "leak_bytes_per_request": LEAK_BYTES,
        "median_ratio_auto_over_off": statistics.median(run["ratio"] for run in runs),
        "median_call_in_window_over_outside": statistics.median(window_costs) if window_costs else None,
        "median_call_outside_window_over_off": statistics.median(outside_costs) if outside_costs else None,
        # capture's own time in an auto run, as a share of its wall time: the controller on the sampler's
        # thread, and the window's calls beyond what they take outside it
        "median_own_share": statistics.median(
            (
                run["auto"]["controller_s"]
                + run["auto"]["calls_in_window_s"]
                - run["auto"]["calls_in_window"] * (run["auto"]["call_s_outside"] or 0)
            )
            / run["auto"]["wall_s"]
            for run in runs
        ),
        "runs": runs,
    }
    print(
        f"median wall ratio auto/off: {result['median_ratio_auto_over_off']:.3f}; a call inside the window against "
        f"outside: {result['median_call_in_window_over_outside']}; outside the window against off: "
        f"{result['median_call_outside_window_over_off']}; capture's own time: {result['median_own_share']:.2%} of the wall"
    )
    if args.json:
        with open(args.json, "w") as output:
            json.dump(result, output, indent=1)


if __name__ == "__main__":
    main()
