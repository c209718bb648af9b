"""A stand-in for TurboMind's native `_turbomind` extension, which needs CUDA.

Only the C++ side is replaced: LMDeploy's real Python (`TurboMind`, `TurboMindInstance`,
`AsyncEngine`, the pipeline) runs on top of it. The fake engine answers each request from a
thread of its own, writing tokens into the shared output buffer and calling the signal callback,
as the C++ engine does, so the asyncio hand-off between threads is the real one.
"""

from __future__ import annotations

import threading
import time
import types

import torch


class _EnumLike(type):
    """Native enums (`DataType.TYPE_BF16`, …): any member name is its own value."""

    def __getattr__(cls, name: str) -> str:
        if name.startswith("__"):
            raise AttributeError(name)
        return name


class DataType(metaclass=_EnumLike):
    pass


class TensorMap(dict):
    pass


def from_dlpack(value):
    return value


class SessionParam:
    def __init__(self, id, step):
        self.id = id
        self.step = step


class GenerationConfig(types.SimpleNamespace):
    pass


class EngineConfig(types.SimpleNamespace):
    pass


class RequestMetrics(types.SimpleNamespace):
    pass


class _State:
    def __init__(self, status: int, seq_len: int):
        self.status = status
        self.seq_len = seq_len


class _SharedState:
    """The native shared state: the latest (status, seq_len), consumed by the Python side."""

    def __init__(self, seq_len: int):
        self._lock = threading.Lock()
        self._state = _State(0, seq_len)

    def publish(self, status: int, seq_len: int) -> None:
        with self._lock:
            self._state = _State(status, seq_len)

    def consume(self) -> _State:
        with self._lock:
            return self._state


class ModelRequest:
    """One request slot: `forward` starts generation on an engine thread and returns at once."""

    FINISH = 7
    CANCEL = 8

    def __init__(self, comm: ModelComm):
        self._comm = comm
        self._cancelled = threading.Event()

    def forward(self, inputs, mm_inputs, session, gen_cfg, stream_output, enable_metrics, signal_cb):
        input_ids = inputs["input_ids"]
        input_len = len(input_ids)
        max_new = int(getattr(gen_cfg, "max_new_tokens", 16) or 16)
        output_ids = torch.zeros(input_len + max_new, dtype=torch.int32)
        output_ids[:input_len] = input_ids
        shared = _SharedState(input_len)
        self._cancelled.clear()
        self._comm.active += 1
        self._comm.seen_inputs.append({"session": session.id, "input_len": input_len, "mm": mm_inputs is not None})

        def run() -> None:
            seq_len = input_len
            try:
                for step in range(max_new):
                    if self._cancelled.is_set():
                        shared.publish(self.CANCEL, seq_len)
                        signal_cb()
                        return
                    time.sleep(self._comm.token_seconds)
                    output_ids[seq_len] = 1000 + step
                    seq_len += 1
                    self._comm.scheduler_tick += 1
                    shared.publish(self.FINISH if step == max_new - 1 else 0, seq_len)  # the last token finishes
                    signal_cb()
                if max_new == 0:
                    shared.publish(self.FINISH, seq_len)
                    signal_cb()
            finally:
                self._comm.active -= 1

        threading.Thread(target=run, name="turbomind-standin-engine", daemon=True).start()
        now_us = int(time.time() * 1e6)
        metrics = RequestMetrics(cached_tokens=0, enqueue_time=now_us, scheduled_time=now_us)
        return TensorMap(output_ids=output_ids), shared, metrics

    def cancel(self) -> None:
        self._cancelled.set()

    def set_grammar(self, grammar) -> None:
        self.grammar = grammar


class Gemm:
    """The GEMM dispatcher: this stand-in can run every data format."""

    class _Everything:
        def __contains__(self, item) -> bool:
            return True

    def data_types(self, data_format) -> _Everything:
        return self._Everything()


class NativeVisionModel:
    """The converter's ViT front (`source_model`): packs pixel tensors into native ViT inputs."""

    def to_turbomind_multimodal(self, multimodal):
        return [
            {"pixels": tuple(item["pixel_values"].shape), "grid_thw": item["image_grid_thw"].tolist()}
            for item in multimodal
        ]


class ScheduleMetrics(types.SimpleNamespace):
    pass


class ModelComm:
    """The engine handle (`model_comm`): request slots and scheduler state."""

    def __init__(self, token_seconds: float = 0.001):
        self.token_seconds = token_seconds
        self.active = 0
        self.scheduler_tick = 0
        self.seen_inputs: list[dict] = []

    def create_request(self) -> ModelRequest:
        return ModelRequest(self)

    def get_schedule_metrics(self, rank: int) -> ScheduleMetrics:
        return ScheduleMetrics(
            active_seqs=self.active,
            waiting_seqs=0,
            cache_usage=min(1.0, self.active / 8),
            prefix_cache_hit_rate=0.0,
            scheduler_tick=self.scheduler_tick,
        )

    def is_dummy_node(self) -> bool:
        return False


class TurboMind:
    """`_tm.TurboMind`: only `create` is reached, and only if a caller builds the engine natively."""

    @staticmethod
    def create(model_dir: str = "", engine_config=None) -> ModelComm:
        return ModelComm()


_placeholders: dict[str, type] = {}


def __getattr__(name: str) -> type:
    """Native classes this stand-in does not model are only named at import (bases, annotations)."""
    if name.startswith("__"):
        raise AttributeError(name)
    if name not in _placeholders:
        _placeholders[name] = _EnumLike(name, (), {"__init__": lambda self, *a, **k: None})
    return _placeholders[name]
