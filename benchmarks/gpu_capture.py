"""Allocation sites on a GPU: a torch tensor leak injected in `ImageEncoder.preprocess`, on the PyTorch
engine and on TurboMind, captured by torch's memory history in a window that `capture=auto` opens, and
named by this file's line; a run without the leak opens no window; torch records no history outside
the window.

    python3 benchmarks/gpu_capture.py OUT [--backends pytorch,turbomind] [--requests 400] [--model DIR]

Each (backend, scenario) runs in a fresh process under `vlmtrace.instrument(capture="auto")` with its
journal in `OUT/<backend>-<scenario>/` (the torch snapshot `capture-PID-N.pickle` beside it, for
https://pytorch.org/memory_viz): `tensor` keeps a CUDA tensor of `--rate` bytes per image in the encoder's
preprocessing, `none` keeps nothing. Each process also times its pipeline calls inside and outside the
window (what torch's history costs while it is on) and checks, by a probe tensor's block in
`torch.cuda.memory._snapshot()`, that no stack is recorded before the window and after it. Then the
journals are analysed as `vlmtrace report` would: `OUT/summary.json` holds every check; exit 0 when all
hold, 1 otherwise. The journals are fixtures: copy `OUT/<backend>-<scenario>/` into tests/analysis/data/gpu/.
Needs the GPU set-up of benchmarks/gpu/README.md (LMDeploy 0.18 and the tiny VLM).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20
IN_FLIGHT = 4


def install_leak(kept: list, rate: int) -> None:
    """Patches `ImageEncoder.preprocess` before vlmtrace wraps it: the leak runs inside its span."""
    import torch
    from lmdeploy.vl.engine import ImageEncoder

    original = ImageEncoder.preprocess

    async def preprocess(encoder, *args, **kwargs):
        kept.append(torch.empty(rate, dtype=torch.uint8, device="cuda"))  # the leak's line
        return await original(encoder, *args, **kwargs)

    ImageEncoder.preprocess = preprocess


LEAK_LINE = next(
    number
    for number, text in enumerate(inspect.getsource(sys.modules[__name__]).splitlines(), 1)
    if text.strip().endswith("# the leak's line") and "kept.append" in text
)


def history_recorded() -> bool:
    """Whether torch records allocation stacks now: a probe tensor's block in the snapshot has frames."""
    import torch

    probe = torch.empty(MiB + 4096, dtype=torch.uint8, device="cuda")
    address = probe.data_ptr()
    for segment in torch.cuda.memory._snapshot()["segments"]:
        for block in segment["blocks"]:
            if block["address"] == address:
                return bool(block.get("frames"))
    return False


def one(backend: str, scenario: str, out: str, requests: int, rate: int) -> None:
    """One run in this process; its result in OUT/<backend>-<scenario>.result.json."""
    sys.path.insert(0, HERE)
    import torch
    from workload import ImageSet, build_pipeline, generation_config

    import vlmtrace
    from vlmtrace.instrumentation.instrumentor import LMDeployInstrumentor

    name = f"{backend}-{scenario}"
    kept: list = []
    torch.cuda.init()  # CUDA is up before the run in both scenarios (the history needs it, the leak makes it)
    if scenario == "tensor":
        install_leak(kept, rate)
    journal = os.path.join(out, name)
    vlmtrace.instrument(
        journal=journal,
        service_name=f"gpu-capture-{backend}",
        capture="auto",
        capture_window_requests=64,
        sample_interval_ms=50,
    )
    pipe = build_pipeline(backend, max_batch_size=8)
    gen = generation_config()
    images = ImageSet(8, 0, 1)
    pipe(images.prompts(IN_FLIGHT), gen_config=gen)  # warm
    before = history_recorded()
    calls, inside = [], []
    for _ in range(requests // IN_FLIGHT):
        started = time.perf_counter()
        pipe(images.prompts(IN_FLIGHT), gen_config=gen)
        calls.append(time.perf_counter() - started)
        session = LMDeployInstrumentor.session
        inside.append(session is not None and session.capture is not None and session.capture.capturing)
    time.sleep(1.0)  # the sampler's last readings
    vlmtrace.uninstrument()
    after = history_recorded()
    in_window = [seconds for seconds, tracing in zip(calls, inside) if tracing]
    outside = [seconds for seconds, tracing in zip(calls, inside) if not tracing]
    result = {
        "backend": backend,
        "scenario": scenario,
        "requests": len(calls) * IN_FLIGHT,
        "leaked_bytes": sum(t.numel() for t in kept),
        "history_before_window": before,
        "history_after_window": after,
        "calls_in_window": len(in_window),
        "call_ms_in_window": 1e3 * statistics.median(in_window) if in_window else None,
        "call_ms_outside": 1e3 * statistics.median(outside) if outside else None,
    }
    with open(os.path.join(out, f"{name}.result.json"), "w") as written:
        json.dump(result, written, indent=1)
    print(json.dumps(result), flush=True)
    sys.stdout.flush()
    os._exit(0)  # LMDeploy's teardown can hang; the journal is closed


def check(out: str, backend: str, scenario: str) -> dict:
    """The run analysed as `vlmtrace report` reads it, and its checks."""
    from vlmtrace.analysis.pipeline import analyze
    from vlmtrace.analysis.readers.detect import read_inputs
    from vlmtrace.analysis.wording import headline

    name = f"{backend}-{scenario}"
    with open(os.path.join(out, f"{name}.result.json")) as stored:
        result = json.load(stored)
    journal = os.path.join(out, name)
    analysis = analyze(read_inputs([journal]))
    summary = analysis.summary
    captures = analysis.data.captures
    tensor = sorted(
        (verdict for verdict in summary.verdicts if verdict.component == "tensor"),
        key=lambda verdict: (verdict.klass != "tensor_leak", not verdict.allocation_sites),
    )
    first = tensor[0].allocation_sites[0] if tensor and tensor[0].allocation_sites else None
    checks = {
        "no history before the window": not result["history_before_window"],
        "no history after the window": not result["history_after_window"],
    }
    if scenario == "tensor":
        tensor_windows = [capture.tool for capture in captures if "tensor" in capture.components]
        checks["one torch window for the tensor"] = tensor_windows == ["torch.cuda.memory._record_memory_history"]
        covered = [component for capture in captures for component in capture.components]
        checks["at most one window a component"] = len(covered) == len(set(covered))
        checks["a tensor leak in vision.preprocess"] = (
            bool(tensor) and tensor[0].klass == "tensor_leak" and tensor[0].stage == "vision.preprocess"
        )
        checks["named by file and line"] = first is not None and (os.path.basename(first["file"]), first["line"]) == (
            "gpu_capture.py",
            LEAK_LINE,
        )
        torch_windows = [capture for capture in captures if capture.snapshot is not None]
        checks["the snapshot beside the journal"] = bool(torch_windows) and all(
            os.path.exists(os.path.join(journal, capture.snapshot)) for capture in torch_windows
        )
    else:
        checks["no window"] = captures == []
    return {
        **result,
        "checks": checks,
        "headline": headline(summary),
        "first_site": first,
        "explained": tensor[0].allocation_sites_explained if tensor else None,
        "problems": [problem for problem in summary.to_dict()["problems"] if problem["severity"] == "error"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--backends", default="pytorch,turbomind")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rate", type=int, default=4 * MiB)
    parser.add_argument("--model", help="the model directory (default: $VLMTRACE_TINY_VLM)")
    parser.add_argument("--one", nargs=2, metavar=("BACKEND", "SCENARIO"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.model:
        os.environ["VLMTRACE_TINY_VLM"] = args.model
    if args.one:
        one(args.one[0], args.one[1], args.out, args.requests, args.rate)
        return
    runs = []
    for backend in args.backends.split(","):
        for scenario in ("tensor", "none"):
            started = time.monotonic()
            done = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    args.out,
                    "--one",
                    backend,
                    scenario,
                    "--requests",
                    str(args.requests),
                    "--rate",
                    str(args.rate),
                ],
                capture_output=True,
                text=True,
                timeout=900,
                check=False,
                start_new_session=True,
            )
            with open(os.path.join(args.out, f"{backend}-{scenario}.log"), "w") as log:
                log.write(done.stdout[-20000:] + done.stderr[-20000:])
            if not os.path.exists(os.path.join(args.out, f"{backend}-{scenario}.result.json")):
                runs.append(
                    {
                        "backend": backend,
                        "scenario": scenario,
                        "checks": {"the run finished": False},
                        "exit": done.returncode,
                    }
                )
                continue
            runs.append({**check(args.out, backend, scenario), "wall_s": round(time.monotonic() - started, 1)})
            print(backend, scenario, runs[-1]["checks"], runs[-1]["headline"][:1], flush=True)
    passed = all(all(run["checks"].values()) for run in runs)
    with open(os.path.join(args.out, "summary.json"), "w") as written:
        json.dump(
            {
                "command": " ".join(["python3", "benchmarks/gpu_capture.py", *sys.argv[1:]]),
                "leak_line": LEAK_LINE,
                "passed": passed,
                "runs": runs,
            },
            written,
            indent=1,
            default=str,
        )
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
