"""The api_server under `vlmtrace run`: one trace per HTTP request, across the server and its engine process.

    python3 benchmarks/gpu_api_server.py OUT [--backend pytorch] [--model DIR] [--requests 4] [-- SERVER ARGS]

Starts `python -m vlmtrace run --journal OUT/journal -- python -m lmdeploy serve api_server MODEL
--backend BACKEND ...` with OTLP pointed at a file sink in this process (OUT/otlp/{traces,metrics}.jsonl),
waits for `/v1/models`, sends OpenAI-style chat requests with one base64 image each and a W3C
`traceparent` header (streaming and not, alternately), checks the answers, stops the server with
SIGINT or, with `--stop-signal TERM`, SIGTERM (then SIGTERM, then SIGKILL for the group), and reads every process's journal. It prints, and
writes to OUT/summary.json, which trace ids each process recorded and whether each request's trace
holds the HTTP SERVER span (child of the caller's span), the request span, the engine's spans from the
engine process, and engine steps linked to it; exit status 0 when every check passed.

On a CPU the same runs against LMDeploy's real server with stand-in engines:
`--launcher tests.support.cpu_api_server -- --max-batch-size 4` (see tests/support/).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from otlp_file_sink import OtlpFileSink, received_metric_names, received_spans

from vlmtrace.analysis.readers.compact_records import FullRecords

SERVER_SPAN_KIND = "SERVER"
REQUEST_SPAN_PREFIX = "chat "
ENGINE_STREAM_SPANS = ("lmdeploy.pytorch.stream", "lmdeploy.turbomind.stream")
ENGINE_STEP_SPAN = "lmdeploy.pytorch.forward"
IMAGE_SIZES = ((64, 64), (128, 96), (96, 128), (160, 120), (80, 200))


# Server ---------------------------------------------------------------------------------------------


def server_command(
    model: str, backend: str, port: int, journal: Path, otlp_endpoint: str | None, launcher: str, extra: list[str]
) -> list[str]:
    run = [sys.executable, "-m", "vlmtrace", "run", "--journal", str(journal), "--service-name", "lmdeploy-api-server"]
    if otlp_endpoint:
        run += ["--otlp-endpoint", otlp_endpoint]
    return [
        *run,
        "--",
        sys.executable,
        "-m",
        launcher,
        "serve",
        "api_server",
        model,
        "--backend",
        backend,
        "--server-name",
        "127.0.0.1",
        "--server-port",
        str(port),
        "--cache-max-entry-count",
        "0.05",
        "--session-len",
        "2048",
        *extra,
    ]


def server_environment() -> dict[str, str]:
    """Short export intervals: the run lasts seconds, and the evidence should not wait for shutdown."""
    return dict(os.environ, OTEL_METRIC_EXPORT_INTERVAL="2000", OTEL_BSP_SCHEDULE_DELAY="500", PYTHONUNBUFFERED="1")


def get_json(url: str, timeout: float = 5.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def wait_until_up(base_url: str, process: subprocess.Popen, timeout_s: float) -> str:
    """The served model's id, once `/v1/models` answers; raises if the server exits or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with status {process.returncode} before answering")
        try:
            return get_json(f"{base_url}/v1/models")["data"][0]["id"]
        except (OSError, ValueError, KeyError, IndexError):
            time.sleep(1.0)
    raise TimeoutError(f"no answer from {base_url}/v1/models within {timeout_s:.0f} s")


def stop(process: subprocess.Popen, first: signal.Signals = signal.SIGINT) -> str:
    """`first` (SIGINT or SIGTERM: uvicorn's graceful shutdown either way, which closes the engine process),
    then SIGTERM, then SIGKILL."""
    for sig, wait_s in ((first, 90), (signal.SIGTERM, 30)):
        if process.poll() is not None:
            break
        process.send_signal(sig)
        try:
            process.wait(wait_s)
            return f"{signal.Signals(sig).name}, exit status {process.returncode}"
        except subprocess.TimeoutExpired:
            continue
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)
        return f"SIGKILL (process group), exit status {process.returncode}"
    return f"exited by itself, status {process.returncode}"


# Requests -------------------------------------------------------------------------------------------


def png_data_url(width: int, height: int, seed: int) -> str:
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def chat(base_url: str, model: str, image_url: str, traceparent: str, stream: bool) -> dict:
    """One OpenAI-style chat request; returns {status, finish_reason, completion_tokens (non-streaming)}."""
    body = {
        "model": model,
        "max_tokens": 8,
        "stream": stream,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Describe this image."},
                    {"type": "image_url", "image_url": {"url": image_url}},
                ],
            }
        ],
    }
    request = urllib.request.Request(
        f"{base_url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "traceparent": traceparent},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        text = response.read().decode()
        status = response.status
    if not stream:
        answer = json.loads(text)
        return {
            "status": status,
            "finish_reason": answer["choices"][0]["finish_reason"],
            "completion_tokens": answer["usage"]["completion_tokens"],
        }
    chunks = [
        json.loads(line[len("data: ") :])
        for line in text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    reasons = [c["choices"][0].get("finish_reason") for c in chunks if c.get("choices")]
    return {
        "status": status,
        "finish_reason": next((r for r in reversed(reasons) if r), None),
        "chunks": len(chunks),
        "done": "data: [DONE]" in text,
    }


def answer_ok(answer: dict) -> bool:
    return (
        answer.get("status") == 200
        and answer.get("finish_reason") in ("length", "stop")
        and (answer.get("completion_tokens", 1) > 0)
        and answer.get("done", True)
    )


# Journals -------------------------------------------------------------------------------------------


def read_journal_file(path: Path) -> list[dict]:
    """The JSON records of one journal file as format 2 writes them (a format 3 end completed from its start);
    the mapped window's zero bytes and a fatal block are skipped."""
    records = []
    full = FullRecords()
    for line in path.read_bytes().replace(b"\0", b"").splitlines():
        if line.startswith(b"{"):
            try:
                record = full.full(json.loads(line))
            except ValueError:
                continue
            if record is not None:
                records.append(record)
    return records


def read_journals(folder: Path) -> list[dict]:
    """One entry per process: pid, ppid, argv, clean (an end marker), spans {span_id: merged record}."""
    processes: dict[int, dict] = {}
    for path in sorted(Path(folder).glob("*.jsonl*")):
        records = read_journal_file(path)
        if not records or records[0].get("k") != "header":
            continue
        header = records[0]
        process = processes.setdefault(
            header["pid"],
            {
                "pid": header["pid"],
                "ppid": header.get("ppid"),
                "argv": header.get("argv", []),
                "files": [],
                "clean": False,
                "spans": {},
            },
        )
        process["files"].append(path.name)
        for record in records[1:]:
            kind = record.get("k")
            if kind in ("start", "end"):
                merged = process["spans"].setdefault(record["span_id"], {})
                merged.update(record)
                merged["ended"] = merged.get("ended", False) or kind == "end"
            elif kind == "end_marker":
                process["clean"] = True
    return list(processes.values())


# Summary --------------------------------------------------------------------------------------------


def trace_report(trace_id: str, caller_span_id: str, processes: list[dict], server_pid: int) -> dict:
    """What each process recorded of one request's trace, and whether it hangs together."""
    server = next((p for p in processes if p["pid"] == server_pid), None)
    server_spans = list(server["spans"].values()) if server else []
    in_trace = [s for s in server_spans if s["trace_id"] == trace_id]
    http = [s for s in in_trace if s.get("kind") == SERVER_SPAN_KIND and s.get("parent_id") == caller_span_id]
    requests = [s for s in in_trace if s["name"].startswith(REQUEST_SPAN_PREFIX)]
    by_id = {s["span_id"]: s for s in in_trace}

    def under_http(span: dict) -> bool:
        seen = set()
        while span is not None and span["span_id"] not in seen:
            seen.add(span["span_id"])
            if span.get("kind") == SERVER_SPAN_KIND:
                return True
            span = by_id.get(span.get("parent_id"))
        return False

    request_ids = {s["span_id"] for s in requests}
    engine_streams, linked_steps, engine_pids = [], 0, set()
    for process in processes:
        for span in process["spans"].values():
            if (
                span["trace_id"] == trace_id
                and span["name"] in ENGINE_STREAM_SPANS
                and span.get("parent_id") in request_ids
            ):
                engine_streams.append(span)
                engine_pids.add(process["pid"])
            if span["name"] == ENGINE_STEP_SPAN and any(
                link["trace_id"] == trace_id and link["span_id"] in request_ids for link in span.get("links", [])
            ):
                linked_steps += 1
                engine_pids.add(process["pid"])
    return {
        "trace_id": trace_id,
        "http_server_span": len(http) == 1 and http[0].get("ended", False),
        "request_span_under_http": bool(requests) and all(under_http(s) and s.get("ended") for s in requests),
        "engine_stream_spans": len(engine_streams),
        "engine_steps_linked": linked_steps,
        "engine_pids": sorted(engine_pids),
        "spans_in_trace_by_pid": {
            str(p["pid"]): sum(1 for s in p["spans"].values() if s["trace_id"] == trace_id) for p in processes
        },
    }


def summarize(
    processes: list[dict], sent: list[dict], server_pid: int, backend: str, sink: Path | None, stopped: str
) -> dict:
    engine_children = [p["pid"] for p in processes if p["ppid"] == server_pid]
    traces = [trace_report(s["trace_id"], s["caller_span_id"], processes, server_pid) for s in sent]
    checks = {
        "answers_ok": all(s["ok"] for s in sent),
        "server_journal_clean": any(p["pid"] == server_pid and p["clean"] for p in processes),
        "http_span_child_of_traceparent": all(t["http_server_span"] for t in traces),
        "request_span_under_http_span": all(t["request_span_under_http"] for t in traces),
        "engine_spans_in_request_trace": all(t["engine_stream_spans"] >= 1 for t in traces),
    }
    if backend == "pytorch":
        checks["engine_process_journal"] = bool(engine_children)
        checks["engine_spans_from_engine_process"] = all(set(t["engine_pids"]) & set(engine_children) for t in traces)
        checks["engine_steps_link_to_request"] = all(t["engine_steps_linked"] >= 1 for t in traces)
    summary = {
        "backend": backend,
        "stopped": stopped,
        "processes": [
            {
                "pid": p["pid"],
                "ppid": p["ppid"],
                "role": "server" if p["pid"] == server_pid else ("engine" if p["pid"] in engine_children else "other"),
                "argv": p["argv"][:4],
                "files": p["files"],
                "clean": p["clean"],
                "spans": len(p["spans"]),
                "trace_ids": sorted({s["trace_id"] for s in p["spans"].values()} & {s["trace_id"] for s in sent}),
            }
            for p in processes
        ],
        "requests": [{**s, **t} for s, t in zip(sent, traces)],
    }
    if sink is not None:
        spans = received_spans(sink)
        metrics = received_metric_names(sink)
        summary["otlp"] = {
            "spans": len(spans),
            "trace_ids": sorted({s["trace_id"] for s in spans} & {s["trace_id"] for s in sent}),
            "span_pids": sorted({str(s["resource"].get("process.pid")) for s in spans}),
            "metrics_by_pid": {pid: sorted(names) for pid, names in metrics.items()},
        }
        checks["otlp_spans_for_every_request"] = len(summary["otlp"]["trace_ids"]) == len(sent)
        checks["otlp_request_metrics"] = any("gen_ai.server.request.duration" in n for n in metrics.values())
        # Host memory has been `process.memory.usage` since vlmtrace 0.1's semantic-conventions pass; the
        # committed H200 run (tests/analysis/data/gpu/api-server) has it under its old name.
        host_memory = ("process.memory.usage", "vlmtrace.memory.host.rss")
        checks["otlp_memory_metrics"] = any(name in names for names in metrics.values() for name in host_memory)
    summary["checks"] = checks
    summary["ok"] = all(checks.values())
    return summary


def print_summary(summary: dict) -> None:
    print(f"backend {summary['backend']}; server stopped by {summary['stopped']}")
    for p in summary["processes"]:
        print(
            f"  pid {p['pid']:>7} ({p['role']:6}) clean={p['clean']!s:5} spans={p['spans']:>5} "
            f"our trace ids: {', '.join(t[:8] for t in p['trace_ids']) or '-'}  {' '.join(p['argv'][:3])}"
        )
    for r in summary["requests"]:
        print(
            f"  trace {r['trace_id']}: http={r['http_server_span']} request={r['request_span_under_http']} "
            f"engine streams={r['engine_stream_spans']} (pids {r['engine_pids']}) "
            f"steps linked={r['engine_steps_linked']} answer={r.get('finish_reason') or r.get('error')}"
        )
    if "otlp" in summary:
        o = summary["otlp"]
        print(
            f"  OTLP: {o['spans']} spans from pids {o['span_pids']}, our traces {len(o['trace_ids'])}; metrics from "
            f"pids {sorted(o['metrics_by_pid'])}"
        )
    for name, passed in summary["checks"].items():
        print(f"  [{'ok' if passed else 'FAIL'}] {name}")


# Main -----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", default=os.environ.get("VLMTRACE_TINY_VLM"))
    parser.add_argument("--backend", choices=("pytorch", "turbomind"), default="pytorch")
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--port", type=int, default=23333)
    parser.add_argument("--startup-timeout", type=float, default=180.0)
    parser.add_argument("--launcher", default="lmdeploy", help="python -m LAUNCHER serve api_server ...")
    parser.add_argument("--no-otlp", action="store_true", help="no OTLP export (journals only)")
    parser.add_argument(
        "--stop-signal",
        choices=("INT", "TERM"),
        default="INT",
        help="the signal that stops the server (TERM: as Kubernetes, docker and systemd stop it)",
    )
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if not args.model:
        parser.error("--model (or VLMTRACE_TINY_VLM) is required")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    journal, sink_folder = out / "journal", out / "otlp"
    base_url = f"http://127.0.0.1:{args.port}"

    sink = None if args.no_otlp else OtlpFileSink(sink_folder).__enter__()
    command = server_command(
        args.model, args.backend, args.port, journal, sink.endpoint if sink else None, args.launcher, extra
    )
    print("starting:", " ".join(command), flush=True)
    sent: list[dict] = []
    with open(out / "server.log", "wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=server_environment(), start_new_session=True
        )
        try:
            try:
                model = wait_until_up(base_url, process, args.startup_timeout)
            except (RuntimeError, TimeoutError) as error:
                print(f"server did not come up: {error} (see {out / 'server.log'})", flush=True)
                model, args.requests = None, 0
            else:
                print(f"server up (pid {process.pid}), model {model}", flush=True)
            for index in range(args.requests):
                trace_id, caller_span_id = secrets.token_hex(16), secrets.token_hex(8)
                width, height = IMAGE_SIZES[index % len(IMAGE_SIZES)]
                stream = index % 2 == 1
                try:
                    answer = chat(
                        base_url,
                        model,
                        png_data_url(width, height, index),
                        f"00-{trace_id}-{caller_span_id}-01",
                        stream,
                    )
                except (OSError, ValueError, KeyError) as error:
                    answer = {"status": getattr(error, "code", None), "error": f"{type(error).__name__}: {error}"}
                sent.append(
                    {
                        "trace_id": trace_id,
                        "caller_span_id": caller_span_id,
                        "image": [width, height],
                        "stream": stream,
                        **answer,
                        "ok": answer_ok(answer),
                    }
                )
                print(f"request {index}: {sent[-1]}", flush=True)
            if sent:
                time.sleep(3)  # one more metrics export interval before shutdown
        finally:
            stopped = stop(process, signal.Signals[f"SIG{args.stop_signal}"])
            if sink is not None:
                time.sleep(1)
                sink.__exit__(None, None, None)
    summary = summarize(
        read_journals(journal), sent, process.pid, args.backend, None if args.no_otlp else sink_folder, stopped
    )
    summary["checks"]["server_answered"] = model is not None
    summary["ok"] = all(summary["checks"].values())
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=sorted) + "\n")
    print_summary(summary)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
