"""Record an instrumented run of the tiny VLM on a real GPU: the journal becomes a test fixture.

    python benchmarks/gpu_record.py --backend turbomind --batches 30 --journal out/turbomind

vlmtrace is instrumented before the pipeline is built (so the PyTorch engine's ViT module is
hooked too), then mixed batches of 1-4 image prompts run and the pipeline closes cleanly.
"""

from __future__ import annotations

import argparse
import json
import time

from workload import BACKENDS, batches, build_pipeline, generation_config, timed

import vlmtrace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=BACKENDS, required=True)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--journal", required=True)
    args = parser.parse_args()

    session = vlmtrace.instrument(journal=args.journal, service_name=f"tiny-vlm-{args.backend}")
    pipe = build_pipeline(args.backend)
    gen = generation_config()
    latencies = [timed(pipe, batch, gen) for batch in batches(args.batches, seed=2)]
    pipe.close()
    time.sleep(0.3)  # one more memory sample after the last request
    status = dict(session.status)
    vlmtrace.uninstrument()
    print(
        json.dumps(
            {
                "backend": args.backend,
                "batches": len(latencies),
                "latency_ms": [round(x * 1000, 1) for x in latencies],
                "probes": session.probe.status,
                "targets": status,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
