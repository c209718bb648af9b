"""The scenario matrix on the CPU: host causes injected at every TurboMind stage, recorded
through LMDeploy 0.18's real pipeline on the stand-in TurboMind, each scenario in a fresh process.

    python3 benchmarks/cpu_matrix.py list
    python3 benchmarks/cpu_matrix.py run --out DIR [--workers 2] [--half cpu_tune cpu_held_out]
    python3 benchmarks/cpu_matrix.py analyse --manifest DIR/matrix-manifest.json --journals DIR/packed \
        --half cpu_held_out [--results rows.json]
    python3 benchmarks/cpu_matrix.py allocating-stage --manifest DIR/matrix-manifest.json --journals DIR/packed

What it is for: a matrix that needs no GPU, so that the analyzer's stage and warm-up rules meet runs
nobody tuned them on while no GPU is lent. Host memory is what it tests: the prompt processing, the
vision encoder's preprocessing (the model's image processor), the TurboMind stream's Python, the
request's end and LMDeploy's event loop are LMDeploy's real code; only the native engine (and with it
TurboMind's own ViT) is the stand-in of tests/support, which decodes one token a millisecond and
allocates nothing. Tensor, cache and native causes need a GPU (benchmarks/gpu_matrix.py), and so does
the PyTorch engine.

The causes, their injection points, the recording and the grading are gpu_matrix.py's; the scenarios
are this file's table, split in halves by the same rule (alternating within each cause), and half of
each half is recorded with the heap counter preloaded. Each table was fixed before it ran, after the rules
it tests (docs/accuracy.md).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # tests.support: the stand-in TurboMind

import gpu_matrix

# cause, injection point, prompts per call, requests, MiB per request, heap counter preloaded. Each
# injection point four times (two per half, one of them with the heap counter), at one, four and eight
# prompts in flight, 60 to 240 requests, 0.5 to 2 MiB a request; negatives at the same lengths.
CPU_TABLE = (
    ("host", "prompt", 1, 120, 1, True),
    ("host", "prompt", 8, 240, 0.5, True),
    ("host", "prompt", 8, 120, 2, False),
    ("host", "prompt", 4, 120, 1, False),
    ("host", "vision.preprocess", 8, 240, 1, True),
    ("host", "vision.preprocess", 1, 120, 0.5, False),
    ("host", "vision.preprocess", 4, 60, 2, False),
    ("host", "vision.preprocess", 8, 120, 0.5, True),
    ("host", "engine", 1, 240, 0.5, False),
    ("host", "engine", 8, 120, 1, False),
    ("host", "engine", 8, 60, 2, True),
    ("host", "engine", 4, 240, 2, True),
    ("host", "after_response", 8, 120, 1, False),
    ("host", "after_response", 1, 120, 1, True),
    ("host", "after_response", 4, 120, 2, True),
    ("host", "after_response", 8, 240, 0.5, False),
    ("host", "outside", 1, 120, 1, False),
    ("host", "outside", 8, 240, 0.5, True),
    ("none", None, 1, 120, 0, False),
    ("none", None, 8, 240, 0, True),
    ("none", None, 8, 60, 0, True),
    ("none", None, 4, 60, 0, False),
    ("warmup", None, 1, 240, 0, False),
    ("warmup", None, 8, 120, 0, True),
    ("hostlru", None, 1, 120, 1, False),
    ("hostlru", None, 8, 240, 2, True),
)
# `cpu_held_out_2`: 16 and 40 prompts in flight, 600 and 3 000 requests.
CPU_SECOND_TABLE = (
    ("host", "prompt", 40, 600, 0.5, False),
    ("host", "prompt", 1, 3000, 0.5, True),
    ("host", "vision.preprocess", 40, 3000, 0.5, True),
    ("host", "vision.preprocess", 16, 600, 1, False),
    ("host", "engine", 40, 600, 1, True),
    ("host", "engine", 1, 600, 0.5, False),
    ("host", "engine", 40, 3000, 0.5, False),
    ("host", "after_response", 40, 600, 1, True),
    ("host", "after_response", 16, 3000, 0.5, False),
    ("host", "outside", 40, 600, 1, False),
    ("none", None, 40, 600, 0, False),
    ("none", None, 40, 3000, 0, True),
    ("none", None, 1, 3000, 0, False),
    ("warmup", None, 40, 600, 0, False),
    ("warmup", None, 16, 3000, 0, True),
    ("hostlru", None, 40, 600, 4, True),
    ("hostlru", None, 1, 3000, 1, False),
)
# `cpu_held_out_3`, all with the heap counter: engine-stream and other stages where the allocating stage and
# resident pages may name different stages.
CPU_THIRD_TABLE = (
    ("host", "engine", 8, 90, 2, True),
    ("host", "engine", 4, 120, 1, True),
    ("host", "engine", 16, 240, 1, True),
    ("host", "engine", 1, 180, 1, True),
    ("host", "after_response", 8, 90, 1, True),
    ("host", "after_response", 1, 180, 2, True),
    ("host", "after_response", 16, 240, 0.5, True),
    ("host", "prompt", 4, 90, 2, True),
    ("host", "prompt", 16, 240, 1, True),
    ("host", "vision.preprocess", 1, 180, 1, True),
    ("host", "vision.preprocess", 16, 240, 2, True),
    ("host", "outside", 4, 120, 1, True),
    ("none", None, 8, 180, 0, True),
    ("none", None, 16, 240, 0, True),
    ("warmup", None, 4, 180, 0, True),
    ("hostlru", None, 16, 240, 2, True),
)
# `cpu_held_out_4`, all with the heap counter, most of it where requests overlap (8 and 16 prompts in flight,
# 72 to 160 requests).
CPU_FOURTH_TABLE = (
    ("host", "engine", 8, 72, 1, True),
    ("host", "engine", 16, 144, 2, True),
    ("host", "engine", 8, 128, 0.5, True),
    ("host", "engine", 16, 96, 1, True),
    ("host", "after_response", 8, 104, 2, True),
    ("host", "after_response", 16, 160, 1, True),
    ("host", "after_response", 4, 128, 1, True),
    ("host", "prompt", 8, 72, 1, True),
    ("host", "prompt", 16, 160, 0.5, True),
    ("host", "prompt", 8, 144, 2, True),
    ("host", "vision.preprocess", 8, 104, 2, True),
    ("host", "vision.preprocess", 16, 128, 1, True),
    ("host", "vision.preprocess", 4, 72, 1, True),
    ("host", "outside", 8, 128, 1, True),
    ("host", "outside", 16, 96, 2, True),
    ("none", None, 8, 104, 0, True),
    ("none", None, 16, 160, 0, True),
    ("warmup", None, 8, 128, 0, True),
    ("hostlru", None, 8, 144, 2, True),
    ("hostlru", None, 16, 104, 1, True),
)
# `cpu_held_out_5`, all with the heap counter: large-chunk leaks where requests overlap and runs are short,
# leaks of 4 KiB blocks (which the stage charges do not see) and leaks half of each.
CPU_FIFTH_TABLE = (
    ("host", "engine", 16, 112, 0.5, True),
    ("host", "engine", 8, 200, 2, True),
    ("host", "engine", 4, 64, 1, True),
    ("host", "engine", 1, 120, 1, True),
    ("host", "after_response", 16, 128, 2, True),
    ("host", "after_response", 8, 64, 0.5, True),
    ("host", "prompt", 16, 112, 1, True),
    ("host", "prompt", 4, 160, 0.5, True),
    ("host", "vision.preprocess", 16, 192, 0.5, True),
    ("host", "vision.preprocess", 8, 80, 1, True),
    ("host", "outside", 16, 128, 1, True),
    ("host", "outside", 4, 96, 2, True),
    ("hostsmall", "prompt", 8, 160, 1, True),
    ("hostsmall", "engine", 16, 160, 1, True),
    ("hostsmall", "vision.preprocess", 4, 120, 2, True),
    ("hostmixed", "engine", 8, 160, 2, True),
    ("hostmixed", "vision.preprocess", 16, 128, 1, True),
    ("none", None, 16, 128, 0, True),
    ("warmup", None, 16, 112, 0, True),
    ("hostlru", None, 8, 96, 1, True),
)
# `cpu_held_out_6`, all with the heap counter: mostly the TurboMind stream and the work after the response,
# where one stage hands memory to another, at 8 to 16 in flight.
CPU_SIXTH_TABLE = (
    ("host", "engine", 8, 96, 0.5, True),
    ("host", "engine", 16, 176, 1, True),
    ("host", "engine", 8, 152, 2, True),
    ("host", "engine", 12, 120, 0.5, True),
    ("host", "after_response", 8, 80, 1, True),
    ("host", "after_response", 12, 144, 0.5, True),
    ("host", "after_response", 16, 96, 2, True),
    ("host", "after_response", 4, 104, 0.5, True),
    ("host", "prompt", 12, 132, 2, True),
    ("host", "vision.preprocess", 12, 156, 1, True),
    ("host", "vision.preprocess", 4, 88, 2, True),
    ("host", "outside", 12, 108, 0.5, True),
    ("hostsmall", "after_response", 8, 136, 1, True),
    ("hostmixed", "prompt", 8, 120, 2, True),
    ("none", None, 12, 144, 0, True),
    ("none", None, 8, 72, 0, True),
    ("warmup", None, 12, 120, 0, True),
    ("hostlru", None, 16, 144, 2, True),
)
# `cpu_held_out_7`, all with the heap counter: short runs (60-112 requests) where requests overlap, and the
# negatives a class read from the allocating stage could call: bounded caches that fill within the run, warm-
# up caches, one buffer kept once (`hoststep`).
CPU_SEVENTH_TABLE = (
    ("host", "engine", 8, 64, 0.5, True),
    ("host", "engine", 16, 80, 1, True),
    ("host", "engine", 12, 108, 0.5, True),
    ("host", "prompt", 8, 72, 0.5, True),
    ("host", "vision.preprocess", 12, 84, 1, True),
    ("host", "vision.preprocess", 4, 60, 0.5, True),
    ("host", "after_response", 8, 72, 2, True),
    ("host", "outside", 8, 88, 0.5, True),
    ("hostsmall", "engine", 8, 96, 1, True),
    ("none", None, 8, 64, 0, True),
    ("none", None, 16, 96, 0, True),
    ("warmup", None, 8, 72, 0, True),
    ("warmup", None, 16, 64, 0, True),
    ("hostlru", None, 8, 60, 1, True),
    ("hostlru", None, 4, 72, 2, True),
    ("hostlru", None, 16, 112, 1, True),
    ("hoststep", None, 8, 96, 0, True),
    ("hoststep", None, 4, 72, 0, True),
)
# `cpu_held_out_8`, all with the heap counter: the work after the response and the TurboMind stream at 8 in
# flight, 64-104 requests, 0.5-1 MiB per request, where hand-offs are; a few of every other stage and
# negative.
CPU_EIGHTH_TABLE = (
    ("host", "after_response", 8, 64, 1, True),
    ("host", "after_response", 8, 80, 0.5, True),
    ("host", "after_response", 8, 96, 0.5, True),
    ("host", "after_response", 6, 90, 1, True),
    ("host", "after_response", 10, 100, 0.5, True),
    ("host", "engine", 8, 88, 1, True),
    ("host", "engine", 6, 96, 0.5, True),
    ("host", "engine", 10, 80, 1, True),
    ("host", "engine", 8, 104, 2, True),
    ("host", "prompt", 6, 90, 1, True),
    ("host", "vision.preprocess", 10, 100, 1, True),
    ("host", "outside", 6, 84, 1, True),
    ("none", None, 6, 90, 0, True),
    ("warmup", None, 10, 100, 0, True),
    ("hostlru", None, 6, 96, 1, True),
    ("hoststep", None, 10, 80, 0, True),
)
# `cpu_held_out_9`, all with the heap counter: the stream and the work after the response at 8-16 in flight,
# leaks of 4 KiB blocks and short fast leaks (which are not one jump), buffers kept once and caches filled
# early (which are).
CPU_NINTH_TABLE = (
    ("host", "engine", 8, 72, 0.5, True),
    ("host", "engine", 16, 96, 0.5, True),
    ("host", "engine", 12, 120, 1, True),
    ("host", "after_response", 8, 88, 0.5, True),
    ("host", "after_response", 16, 112, 1, True),
    ("host", "vision.preprocess", 8, 64, 2, True),
    ("host", "vision.preprocess", 16, 128, 0.5, True),
    ("host", "prompt", 12, 96, 0.5, True),
    ("host", "outside", 8, 104, 0.5, True),
    ("hostsmall", "engine", 8, 112, 1, True),
    ("hostmixed", "after_response", 8, 96, 1, True),
    ("none", None, 16, 120, 0, True),
    ("hoststep", None, 8, 112, 0, True),
    ("hoststep", None, 16, 96, 0, True),
    ("hostlru", None, 8, 120, 2, True),
    ("warmup", None, 8, 112, 0, True),
)
# `cpu_held_out_10`, all with the heap counter: short leaks of 0.5 MiB at 8-16 in flight, a leak half in small
# blocks, one all in small blocks, and negatives: warm-up caches over runs too short to settle, bounded caches
# filled within the run, a buffer kept once, nothing at all.
CPU_TENTH_TABLE = (
    ("host", "engine", 8, 80, 0.5, True),
    ("host", "engine", 12, 96, 0.5, True),
    ("host", "vision.preprocess", 8, 72, 0.5, True),
    ("host", "vision.preprocess", 12, 108, 0.5, True),
    ("host", "after_response", 12, 96, 0.5, True),
    ("host", "prompt", 16, 112, 0.5, True),
    ("host", "outside", 16, 96, 0.5, True),
    ("hostmixed", "engine", 12, 96, 1, True),
    ("hostsmall", "vision.preprocess", 8, 96, 0.5, True),
    ("warmup", None, 8, 64, 0, True),
    ("warmup", None, 12, 96, 0, True),
    ("warmup", None, 16, 80, 0, True),
    ("hostlru", None, 8, 72, 1, True),
    ("hostlru", None, 12, 96, 0.5, True),
    ("hoststep", None, 12, 88, 0, True),
    ("none", None, 12, 96, 0, True),
)
# `cpu_tune_11`, with the heap counter's survivors (what each stage keeps, by when it was allocated): leaks
# whose stage also holds a working set it gives back every 32 requests (`hostgiveback`), plain leaks, and the
# negatives: the working set alone (`giveback`), a bounded cache, warm-up, a buffer kept once, nothing.
CPU_ELEVENTH_TABLE = (
    ("hostgiveback", "vision.preprocess", 8, 96, 0.5, True),
    ("hostgiveback", "vision.preprocess", 16, 128, 0.5, True),
    ("hostgiveback", "vision.preprocess", 12, 112, 1, True),
    ("hostgiveback", "engine", 8, 112, 0.5, True),
    ("hostgiveback", "prompt", 16, 96, 0.5, True),
    ("host", "vision.preprocess", 12, 96, 0.5, True),
    ("host", "engine", 16, 104, 0.5, True),
    ("giveback", None, 8, 96, 0, True),
    ("giveback", None, 16, 128, 0, True),
    ("giveback", None, 12, 112, 0, True),
    ("hostlru", None, 12, 96, 1, True),
    ("warmup", None, 16, 96, 0, True),
    ("hoststep", None, 12, 96, 0, True),
    ("none", None, 8, 96, 0, True),
)
# `cpu_held_out_12`: the same shapes as `cpu_tune_11`, held out.
CPU_TWELFTH_TABLE = (
    ("hostgiveback", "vision.preprocess", 16, 112, 0.5, True),
    ("hostgiveback", "vision.preprocess", 8, 120, 0.5, True),
    ("hostgiveback", "prompt", 12, 104, 0.5, True),
    ("hostgiveback", "engine", 16, 128, 1, True),
    ("hostgiveback", "after_response", 8, 104, 0.5, True),
    ("hostgiveback", "outside", 12, 120, 0.5, True),
    ("host", "prompt", 8, 96, 0.5, True),
    ("host", "after_response", 16, 112, 0.5, True),
    ("hostsmall", "engine", 12, 96, 0.5, True),
    ("giveback", None, 8, 112, 0, True),
    ("giveback", None, 12, 128, 0, True),
    ("giveback", None, 16, 96, 0, True),
    ("hostlru", None, 16, 112, 0.5, True),
    ("warmup", None, 12, 104, 0, True),
    ("hoststep", None, 8, 120, 0, True),
    ("none", None, 16, 112, 0, True),
)
# `cpu_held_out_13`: leaks beside a given-back working set and their negatives, held out.
CPU_THIRTEENTH_TABLE = (
    ("hostgiveback", "vision.preprocess", 16, 136, 0.5, True),
    ("hostgiveback", "vision.preprocess", 12, 100, 1, True),
    ("hostgiveback", "vision.preprocess", 8, 104, 0.5, True),
    ("hostgiveback", "prompt", 16, 120, 1, True),
    ("hostgiveback", "engine", 12, 108, 0.5, True),
    ("hostgiveback", "after_response", 16, 128, 0.5, True),
    ("hostgiveback", "outside", 8, 112, 1, True),
    ("host", "vision.preprocess", 16, 120, 0.5, True),
    ("host", "engine", 8, 104, 1, True),
    ("hostmixed", "prompt", 12, 108, 1, True),
    ("giveback", None, 16, 120, 0, True),
    ("giveback", None, 12, 104, 0, True),
    ("hostlru", None, 8, 104, 1, True),
    ("hostlru", None, 16, 136, 0.5, True),
    ("warmup", None, 16, 120, 0, True),
    ("hoststep", None, 12, 112, 0, True),
    ("none", None, 12, 100, 0, True),
)
# `cpu_held_out_14`: leaks beside a given-back working set at other lengths and concurrencies, and their
# negatives, held out.
CPU_FOURTEENTH_TABLE = (
    ("hostgiveback", "vision.preprocess", 16, 152, 0.5, True),
    ("hostgiveback", "vision.preprocess", 8, 128, 1, True),
    ("hostgiveback", "vision.preprocess", 12, 116, 0.5, True),
    ("hostgiveback", "prompt", 8, 112, 0.5, True),
    ("hostgiveback", "engine", 16, 144, 0.5, True),
    ("hostgiveback", "engine", 8, 120, 2, True),
    ("hostgiveback", "after_response", 12, 132, 1, True),
    ("hostgiveback", "outside", 16, 128, 0.5, True),
    ("host", "prompt", 16, 104, 0.5, True),
    ("host", "after_response", 12, 120, 1, True),
    ("giveback", None, 8, 128, 0, True),
    ("giveback", None, 16, 144, 0, True),
    ("hostlru", None, 12, 120, 1, True),
    ("warmup", None, 8, 136, 0, True),
    ("hoststep", None, 16, 128, 0, True),
    ("none", None, 8, 120, 0, True),
)
# `cpu_held_out_15`: what each stage keeps at 1 and 40 in flight over 600 to 3 000 requests (the heap
# counter's intervals merge as runs grow, and its reading is taken every 10 s).
CPU_FIFTEENTH_TABLE = (
    ("hostgiveback", "vision.preprocess", 1, 600, 0.5, True),
    ("hostgiveback", "vision.preprocess", 40, 600, 0.5, True),
    ("hostgiveback", "engine", 8, 1200, 0.5, True),
    ("hostgiveback", "prompt", 40, 3000, 0.5, True),
    ("hostgiveback", "after_response", 16, 600, 1, True),
    ("host", "engine", 40, 600, 0.5, True),
    ("host", "vision.preprocess", 1, 1200, 0.5, True),
    ("giveback", None, 40, 600, 0, True),
    ("giveback", None, 1, 1200, 0, True),
    ("hostlru", None, 8, 600, 1, True),
    ("warmup", None, 16, 600, 0, True),
    ("hoststep", None, 40, 600, 0, True),
    ("none", None, 16, 3000, 0, True),
)
# `cpu_held_out_16`: short runs at 8-16 in flight beside a given-back working set, and their negatives.
CPU_SIXTEENTH_TABLE = (
    ("hostgiveback", "vision.preprocess", 8, 100, 0.5, True),
    ("hostgiveback", "vision.preprocess", 16, 104, 0.5, True),
    ("hostgiveback", "vision.preprocess", 12, 124, 1, True),
    ("hostgiveback", "engine", 8, 136, 0.5, True),
    ("hostgiveback", "engine", 12, 96, 1, True),
    ("hostgiveback", "prompt", 8, 100, 0.5, True),
    ("hostgiveback", "after_response", 8, 116, 0.5, True),
    ("hostgiveback", "outside", 12, 104, 0.5, True),
    ("host", "vision.preprocess", 8, 112, 0.5, True),
    ("host", "engine", 12, 100, 0.5, True),
    ("giveback", None, 8, 104, 0, True),
    ("giveback", None, 16, 108, 0, True),
    ("hostlru", None, 8, 112, 0.5, True),
    ("warmup", None, 12, 116, 0, True),
    ("hoststep", None, 8, 104, 0, True),
    ("none", None, 12, 124, 0, True),
)
# Written down before it ran, with the explanations weighed by their fit (docs/analysis.md, "Competing
# explanations"): host leaks of 0.5 MiB a request at 8 in flight over 144-160 requests, whose rate must read
# within 10 %, and negatives of the same lengths that rise without leaking (a working set given back, warm-up,
# a bounded cache, one buffer kept once, nothing); all held out.
CPU_EXPLANATIONS_TABLE = (
    ("host", "vision.preprocess", 8, 160, 0.5, True),
    ("host", "engine", 8, 152, 0.5, True),
    ("host", "prompt", 8, 160, 0.5, False),
    ("hostgiveback", "prompt", 8, 144, 0.5, True),
    ("giveback", None, 8, 120, 0, True),
    ("giveback", None, 16, 152, 0, True),
    ("warmup", None, 8, 160, 0, True),
    ("hostlru", None, 8, 144, 0.5, True),
    ("hoststep", None, 8, 128, 0, True),
    ("none", None, 8, 160, 0, True),
)
# The tables after the first, each under its half's name: all held out but the eleventh.
HELD_OUT_TABLES = (
    ("cpu_held_out_2", CPU_SECOND_TABLE),
    ("cpu_held_out_3", CPU_THIRD_TABLE),
    ("cpu_held_out_4", CPU_FOURTH_TABLE),
    ("cpu_held_out_5", CPU_FIFTH_TABLE),
    ("cpu_held_out_6", CPU_SIXTH_TABLE),
    ("cpu_held_out_7", CPU_SEVENTH_TABLE),
    ("cpu_held_out_8", CPU_EIGHTH_TABLE),
    ("cpu_held_out_9", CPU_NINTH_TABLE),
    ("cpu_held_out_10", CPU_TENTH_TABLE),
    ("cpu_tune_11", CPU_ELEVENTH_TABLE),
    ("cpu_held_out_12", CPU_TWELFTH_TABLE),
    ("cpu_held_out_13", CPU_THIRTEENTH_TABLE),
    ("cpu_held_out_14", CPU_FOURTEENTH_TABLE),
    ("cpu_held_out_15", CPU_FIFTEENTH_TABLE),
    ("cpu_held_out_16", CPU_SIXTEENTH_TABLE),
    ("cpu_held_out_17", CPU_EXPLANATIONS_TABLE),
)
HALVES = ("cpu_tune", "cpu_held_out", *(half for half, _ in HELD_OUT_TABLES))


@dataclasses.dataclass(frozen=True)
class CpuScenario(gpu_matrix.Scenario):
    with_heap_counter: bool = False

    @property
    def heap_counter(self) -> bool:
        return self.with_heap_counter

    @property
    def id(self) -> str:
        return "cpu-" + super().id + ("-heap" if self.with_heap_counter else "")

    def estimate_seconds(self) -> float:
        """Uncontended on a 2-core machine (the first table's runs): start-up and build, ~8 ms a request and
        ~20 ms a call (the stand-in decodes 16 tokens at 1 ms), the tail."""
        return 8 + self.requests * 0.008 + math.ceil(self.requests / self.in_flight) * 0.02 + 2


def scenarios() -> list[CpuScenario]:
    """The first table with its halves, then the later ones (HELD_OUT_TABLES), each all held out."""
    halves = gpu_matrix.halved(tuple(("turbomind", *row[:5]) for row in CPU_TABLE), "cpu_tune", "cpu_held_out")
    chosen = [
        CpuScenario(**{**dataclasses.asdict(s), "with_heap_counter": row[5]}) for s, row in zip(halves, CPU_TABLE)
    ]
    chosen += [CpuScenario("turbomind", *row[:5], half, row[5]) for half, table in HELD_OUT_TABLES for row in table]
    assert len({s.id for s in chosen}) == len(chosen), "scenario ids must be unique across the tables"
    return chosen


def by_id(identifier: str) -> CpuScenario:
    return gpu_matrix.by_id(identifier, scenarios())


def cmd_list(args) -> None:
    chosen = scenarios()
    for s in chosen:
        print(f"{s.id:56} {s.half:13} est {s.estimate_seconds():4.0f} s")
    for half in HALVES:
        mine = [s for s in chosen if s.half == half]
        print(
            f"{half}: {len(mine)} scenarios; stages {sorted({s.stage for s in mine if s.stage})}; "
            f"in flight {sorted({s.in_flight for s in mine})}; heap counter {sum(s.heap_counter for s in mine)}"
        )
    order = gpu_matrix.run_order(chosen)
    print(
        f"pool of {args.workers}, each run 2x slower than alone: "
        f"~{gpu_matrix.simulated_makespan(order, args.workers, 2.0):.0f} s"
    )


def cmd_one(args) -> None:
    from tests.support.cpu_lmdeploy import cpu_lmdeploy, install_native_standin, tiny_vlm_path
    from workload import build_pipeline

    install_native_standin()  # before LMDeploy's TurboMind module is imported (the injection imports it)
    scenario = by_id(args.id)
    os.environ.setdefault("VLMTRACE_TINY_VLM", tiny_vlm_path())
    with cpu_lmdeploy():
        gpu_matrix.record(
            scenario,
            args.out,
            args.stop_at,
            lambda: build_pipeline("turbomind", max_batch_size=max(8, scenario.in_flight)),
            "tiny-vlm-cpu-",
        )


def cmd_run(args) -> None:
    chosen = [
        s
        for s in scenarios()
        if (not args.half or s.half in args.half)
        and (not args.only or any(part in s.id for part in args.only.split(",")))
    ]
    heap_counter = None
    if any(s.heap_counter for s in chosen):
        from vlmtrace.probes.heap import library as build

        heap_counter = str(build())

    def start(scenario: CpuScenario, stop_at: float):
        command = [
            sys.executable,
            os.path.abspath(__file__),
            "one",
            "--id",
            scenario.id,
            "--out",
            args.work,
            "--stop-at",
            str(stop_at),
        ]
        return command, gpu_matrix.child_environment(scenario, heap_counter)

    gpu_matrix.run_pool(args, chosen, start)


def _without_heap_stages(source: str, target: str) -> None:
    """The journal files of `source` copied to `target` without the heap counter's charges by allocating
    stage (sc.MEM_HOST_HEAP_BY_STAGE): the same run as an analyzer without those charges sees it."""
    import gzip

    import orjson

    from vlmtrace import semconv as sc

    def strip(value) -> None:
        if isinstance(value, dict):
            value.pop(sc.MEM_HOST_HEAP_BY_STAGE, None)
            for item in value.values():
                strip(item)
        elif isinstance(value, list):
            for item in value:
                strip(item)

    os.makedirs(target, exist_ok=True)
    for name in os.listdir(source):
        with gzip.open(os.path.join(source, name), "rb") as lines, gzip.open(os.path.join(target, name), "wb") as out:
            for line in lines:
                if sc.MEM_HOST_HEAP_BY_STAGE.encode() in line:
                    record = orjson.loads(line)
                    strip(record)
                    out.write(orjson.dumps(record) + b"\n")
                else:
                    out.write(line)


def cmd_allocating_stage(args) -> None:
    """Each run recorded with the heap counter, analysed with and without the charges by allocating stage."""
    import tempfile

    from vlmtrace.analysis.pipeline import analyze
    from vlmtrace.analysis.readers.detect import read_inputs

    with open(args.manifest) as manifest:
        entries = [e for e in json.load(manifest) if e["heap_counter"] and e["cause"] == "host"]
    print("| scenario | stage expected | with the allocating stage | without it |\n| --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as scratch:
        for entry in entries:
            recorded = os.path.join(args.journals, entry["id"])
            stripped = os.path.join(scratch, entry["id"])
            _without_heap_stages(recorded, stripped)
            found = []
            for path in (recorded, stripped):
                verdict = next(v for v in analyze(read_inputs([path])).summary.verdicts if v.component == "host")
                withheld = verdict.evidence.get("stage_withheld_by")
                found.append(verdict.stage or (f"withheld ({withheld})" if withheld else "none"))
            print(f"| {entry['id']} | {entry['expected_stage'] or 'none'} | {found[0]} | {found[1]} |", flush=True)


def main() -> None:
    parser, commands = gpu_matrix.matrix_parser(
        __doc__.split("\n")[0], HALVES, "only these halves", "/tmp/vt-cpu-matrix", 3600, 2, 2.0
    )
    allocating = commands.add_parser(
        "allocating-stage", help="the heap counter's runs analysed with and without the charges by allocating stage"
    )
    allocating.add_argument("--manifest", required=True)
    allocating.add_argument("--journals", required=True, help="a folder with ID/ per scenario")
    args = parser.parse_args()
    {
        "list": cmd_list,
        "run": cmd_run,
        "one": cmd_one,
        "analyse": gpu_matrix.cmd_analyse,
        "allocating-stage": cmd_allocating_stage,
    }[args.command](args)


if __name__ == "__main__":
    main()
